"""One torch TCPStore client process for c10dstore's tests.

Usage: torch_store_client.py HOST PORT RANK WORLD
Prints one JSON line with what it observed; exits non-zero on any failure.
"""
import json
import sys
from datetime import timedelta

import torch.distributed as dist

host, port, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out = {"rank": rank}

# is_master=False: the Go server is the store. wait_for_workers (default)
# makes the constructor ADD "init/" 1.
st = dist.TCPStore(host, port, world, False, timedelta(seconds=60))

st.set(f"rank{rank}", f"hello{rank}")
out["counter"] = st.add("counter", 1)

# Every rank waits for every rank's key, then reads them all.
st.wait([f"rank{r}" for r in range(world)])
out["values"] = [st.get(f"rank{r}").decode() for r in range(world)]

# compare_set race: the first to claim "leader" wins; all see the winner.
st.compare_set("leader", "", f"r{rank}")
out["leader"] = st.get("leader").decode()
# A compare_set with the wrong expected value changes nothing.
out["leader_cas_wrong"] = st.compare_set("leader", "not-it", "x").decode()

# (TCPStore.check is not exposed to Python in torch 1.13; CHECK is covered
# by the Go tests.)

st.set(f"tmp{rank}", "x")
out["delete_first"] = st.delete_key(f"tmp{rank}")
out["delete_again"] = st.delete_key(f"tmp{rank}")

# A wait with a timeout on a key that never comes raises.
try:
    st.wait([f"never{rank}"], timedelta(milliseconds=300))
    out["wait_timeout"] = "returned"
except RuntimeError as e:
    out["wait_timeout"] = str(e)

# The connection is still usable after the timed-out wait.
out["after_timeout"] = st.get(f"rank{rank}").decode()

# Barrier: the last rank to arrive releases everyone.
if st.add("arrived", 1) == world:
    st.set("all_arrived", "1")
st.wait(["all_arrived"])
out["num_keys"] = st.num_keys()
print(json.dumps(out), flush=True)

"""One gloo worker for c10dstore's tests: init_process_group through the Go
store, then all_reduce.

Usage: torch_gloo_allreduce.py MODE HOST PORT RANK WORLD
MODE "store": pass TCPStore(host, port, is_master=False) explicitly.
MODE "env": env:// with TORCHELASTIC_USE_AGENT_STORE=True, as torchrun's
workers do when the agent hosts the store.
"""
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

mode, host, port, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
timeout = timedelta(seconds=60)
if mode == "store":
    st = dist.TCPStore(host, port, world, False, timeout)
    dist.init_process_group("gloo", store=st, rank=rank, world_size=world, timeout=timeout)
else:
    os.environ.update({
        "MASTER_ADDR": host, "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(world), "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
    })
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)

t = torch.tensor([float(rank + 1), 1.0])
dist.all_reduce(t)
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})
dist.barrier()
print(json.dumps({"rank": rank, "sum": t.tolist(), "gathered": [o["rank"] for o in objs]}), flush=True)
dist.destroy_process_group()

#!/usr/bin/env python3
"""A DDP (gloo) worker that hangs, in one of two modes. It calls
elastic_event_detected() every step and nothing else of the helper's for
progress, as HyperPod's loops do. Rank 0 prints "step=N world_size=W loss=L"
per step; a committed checkpoint every 5 steps; resumes from it.

    hang_worker.py collective HANG_RANK HANG_STEP STEPS CKPT_DIR

rank HANG_RANK sleeps before its all_reduce at step HANG_STEP of the first
attempt: the other ranks wait in the collective.

    hang_worker.py startup FAIL_RANK FAIL_STEP HANG_RANK STEPS CKPT_DIR

rank FAIL_RANK exits 1 at step FAIL_STEP of the first attempt (a peer
failure: the job restarts), and rank HANG_RANK hangs in the next attempt
before its first heartbeat, before init_process_group: the other ranks wait
in it, and no worker of that attempt sends a heartbeat.
"""

import datetime
import os
import sys
import time

import hyperpodrun_elastic as he
import torch
import torch.distributed as dist


def stuck_before_all_reduce():
    time.sleep(3600)


def stuck_before_first_heartbeat():
    time.sleep(3600)


def fail():
    sys.exit(1)


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if mode == "collective":
        # The rank and step at which the first attempt does what.
        at_rank, at_step, act = int(args[0]), int(args[1]), stuck_before_all_reduce
        steps, ckpt_dir = int(args[2]), args[3]
    elif mode == "startup":
        at_rank, at_step, act = int(args[0]), int(args[1]), fail
        steps, ckpt_dir = int(args[3]), args[4]
        if attempt == 1 and int(os.environ["RANK"]) == int(args[2]):
            stuck_before_first_heartbeat()
    else:
        sys.exit("usage: hang_worker.py collective|startup ...")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    ck = he.latest_checkpoint()
    start = ck.step if ck else 0
    total = torch.zeros(1)
    if ck:
        total = torch.load(ck.path)["total"]
    for step in range(start, steps):
        if he.elastic_event_detected():
            he.save_and_commit({"total": total}, os.path.join(ckpt_dir, "step-%d.pt" % step), step)
            return
        if rank == at_rank and step == at_step and attempt == 0:
            act()
        t = torch.ones(1)
        dist.all_reduce(t)
        total += t
        if rank == 0:
            print("step=%d world_size=%d loss=%f" % (step + 1, world, 1.0 / (step + 1)), flush=True)
        if (step + 1) % 5 == 0:
            he.save_and_commit({"total": total}, os.path.join(ckpt_dir, "step-%d.pt" % (step + 1)), step + 1)
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

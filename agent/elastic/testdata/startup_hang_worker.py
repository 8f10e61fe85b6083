#!/usr/bin/env python3
"""A DDP (gloo) worker that calls the helper every step in its first attempt,
where rank FAIL_RANK exits 1 at step FAIL_STEP (a peer failure: the job
restarts), and whose rank HANG_RANK hangs in the next attempt before its
first heartbeat, before init_process_group: the other ranks wait in it, and
no worker of that attempt sends a heartbeat. Rank 0 prints "step=N
world_size=W loss=L" per step; a committed checkpoint every 5 steps;
resumes from it.

    startup_hang_worker.py FAIL_RANK FAIL_STEP HANG_RANK STEPS CKPT_DIR
"""

import datetime
import os
import sys
import time

import hyperpodrun_elastic as he
import torch
import torch.distributed as dist


def stuck_before_first_heartbeat():
    time.sleep(3600)


def main():
    fail_rank, fail_step, hang_rank = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    steps, ckpt_dir = int(sys.argv[4]), sys.argv[5]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 1 and int(os.environ["RANK"]) == hang_rank:
        stuck_before_first_heartbeat()
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
        if rank == fail_rank and step == fail_step and attempt == 0:
            sys.exit(1)
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

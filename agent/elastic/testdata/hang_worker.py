#!/usr/bin/env python3
"""A DDP (gloo) worker whose rank HANG_RANK sleeps before its all_reduce at
step HANG_STEP of the first attempt: the other ranks wait in the collective.
It calls elastic_event_detected() every step and nothing else of the helper's
for progress, as HyperPod's loops do. Rank 0 prints "step=N world_size=W
loss=L" per step; a committed checkpoint every 5 steps; resumes from it.

    hang_worker.py HANG_RANK HANG_STEP STEPS CKPT_DIR
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


def main():
    hang_rank, hang_step, steps, ckpt_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ck = he.latest_checkpoint()
    start = ck.step if ck else 0
    total = torch.zeros(1)
    if ck:
        total = torch.load(ck.path)["total"]
    for step in range(start, steps):
        if he.elastic_event_detected():
            he.save_and_commit({"total": total}, os.path.join(ckpt_dir, "step-%d.pt" % step), step)
            return
        if rank == hang_rank and step == hang_step and attempt == 0:
            stuck_before_all_reduce()
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

#!/usr/bin/env python3
"""A DDP (gloo) worker that checkpoints every 5 steps and on a planned
change, through hyperpodrun_elastic.save_and_commit; its saves fail with
ENOSPC (as on a full disk) while CKPT_DIR/FULL exists. Rank 0 prints
"step=N world_size=W loss=L" per step.

    ckpt_worker.py STEPS CKPT_DIR
"""

import errno
import os
import sys
import time

import hyperpodrun_elastic as he
import torch
import torch.distributed as dist


def main():
    steps, ckpt_dir = int(sys.argv[1]), sys.argv[2]
    full = os.path.join(ckpt_dir, "FULL")

    def save_fn(obj, f):
        if os.path.exists(full):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        torch.save(obj, f)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ck = he.latest_checkpoint()
    step = ck.step if ck else 0
    while step < steps:
        t = torch.ones(1)
        dist.all_reduce(t)
        step += 1
        if rank == 0:
            print("step=%d world_size=%d loss=%f" % (step, world, 1.0 / step), flush=True)
        time.sleep(0.05)
        if he.elastic_event_detected():
            he.save_and_commit({"step": step}, os.path.join(ckpt_dir, "step-%d.pt" % step), step, save_fn=save_fn)
            he.report_stopping(step)
            return
        if step % 5 == 0:
            he.save_and_commit({"step": step}, os.path.join(ckpt_dir, "step-%d.pt" % step), step, save_fn=save_fn)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

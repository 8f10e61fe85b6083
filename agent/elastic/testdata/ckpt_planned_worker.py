#!/usr/bin/env python3
"""A DDP (gloo) worker whose every rank saves its shard of a checkpoint
through hyperpodrun_elastic.save_and_commit: periodically up to step
PERIODIC_UNTIL (every 5 steps), then only on a planned change. The saves
fail with ENOSPC (as on a full disk) while CKPT_DIR/FULL exists. Under
--inprocess-resize a planned change reconfigures in process (the state is
the step, kept in memory); otherwise the worker exits 0 after the save.
Rank 0 prints "step=N world_size=W loss=L" per step.

    ckpt_planned_worker.py STEPS CKPT_DIR PERIODIC_UNTIL
"""

import errno
import os
import sys
import time

import hyperpodrun_elastic as he
import torch
import torch.distributed as dist


def main():
    steps, ckpt_dir, periodic_until = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    full = os.path.join(ckpt_dir, "FULL")

    def save_fn(obj, f):
        if os.path.exists(full):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        torch.save(obj, f)

    def save(step):
        return he.save_and_commit({"step": step}, os.path.join(ckpt_dir, "step-%d" % step), step,
                                  sharded=True, save_fn=save_fn)

    model = torch.nn.Linear(1, 1)
    dist.init_process_group("gloo")
    ck = he.latest_checkpoint()
    step = ck.step if ck else 0
    if he.inprocess_enabled():
        got = he.broadcast_state(model, None, step)
        step = step if got is None else got
    while step < steps:
        t = torch.ones(1)
        dist.all_reduce(t)
        step += 1
        if dist.get_rank() == 0:
            print("step=%d world_size=%d loss=%f" % (step, dist.get_world_size(), 1.0 / step), flush=True)
        time.sleep(0.05)
        if he.elastic_event_detected():
            save(step)
            if not he.inprocess_enabled():
                he.report_stopping(step)
                return
            if he.reconfigure(step) is None:
                return  # this node leaves the job
            got = he.broadcast_state(model, None, step)
            if got is None:
                ck = he.latest_checkpoint()
                got = ck.step if ck else 0
            step = got
            continue
        if step % 5 == 0 and step <= periodic_until:
            save(step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

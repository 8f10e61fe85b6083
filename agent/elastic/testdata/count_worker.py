#!/usr/bin/env python3
"""A worker without torch: counts steps of 50 ms into $OUT/steps.$NODE
(one line per start, "start resume=<step>", and one per step), resuming
from the committed checkpoint, and commits a checkpoint every 5 steps.
Ends after 100000 steps."""

import os
import time

import hyperpodrun_elastic as he

out = os.path.join(os.environ["OUT"], "steps." + os.environ["NODE"])
ck = he.latest_checkpoint()
step = ck.step if ck else 0
with open(out, "a") as f:
    f.write("start resume=%d\n" % step)
while step < 100000:
    time.sleep(0.05)
    step += 1
    with open(out, "a") as f:
        f.write("step %d\n" % step)
    if step % 5 == 0 and os.environ.get("RANK") == "0":
        he.report_checkpoint(step, os.path.join(os.environ["OUT"], "ckpt-%d" % step))

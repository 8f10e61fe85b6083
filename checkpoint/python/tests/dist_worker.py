"""One rank of the 2-process agreement test (run by test_distributed.py).

argv: package root, "native" | "hyperpod", checkpoint dir.
"""
import os
import sys
import time

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hyperpodrun_elastic as he  # noqa: E402

if sys.argv[2] == "hyperpod":
    from hyperpod_elastic_agent.elastic_event_handler import elastic_event_detected  # noqa: E402
else:
    from hyperpodrun_elastic import elastic_event_detected  # noqa: E402


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grad = torch.ones(4096)
    for step in range(1, 3000):
        dist.all_reduce(grad)  # stands for DDP's gradient all-reduce
        grad.fill_(1.0)
        time.sleep(0.01)
        print("rank=%d step=%d" % (rank, step), flush=True)
        if elastic_event_detected():
            path = os.path.join(sys.argv[3], "step-%d.pt" % step)
            ok = he.save_and_commit({"step": step}, path, step)
            he.report_stopping(step)
            print("rank=%d DETECTED step=%d committed=%s" % (rank, step, ok), flush=True)
            dist.destroy_process_group()
            return 0
    return 3


if __name__ == "__main__":
    sys.exit(main())

"""A small real PyTorch DDP training run for hyperpodrun (gloo on CPU, nccl on GPU).

Launch it as torchrun would:
    hyperpodrun --standalone --nproc-per-node 4 examples/pytorch/train_ddp.py --steps 30

Rank 0 prints one line per step: ``step=<n> world_size=<w> loss=<float>``, and at the
end ``final: first_loss=<a> last_loss=<b> elastic_launched=<bool>``.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=64, help="global batch size")
    args = p.parse_args()

    launched = dist.is_torchelastic_launched()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if use_cuda else "cpu")

    torch.manual_seed(0)
    # y = X w* + noise: a linear regression every rank can generate locally.
    w_true = torch.randn(16, 1)
    model = DDP(torch.nn.Linear(16, 1).to(device), device_ids=[device.index] if use_cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1000 + rank)
    per_rank = max(1, args.batch // world)

    first = last = None
    for step in range(1, args.steps + 1):
        x = torch.randn(per_rank, 16, generator=gen)
        y = x @ w_true + 0.01 * torch.randn(per_rank, 1, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        mean = t.item() / world
        first = mean if first is None else first
        last = mean
        if rank == 0:
            print(f"step={step} world_size={world} loss={mean:.6f}", flush=True)
    if rank == 0:
        print(f"final: first_loss={first:.6f} last_loss={last:.6f} elastic_launched={launched}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Elastic DDP training under hyperpodrun.

A tiny deterministic linear-regression job that survives resizes without
losing a step:

* gloo on CPU, NCCL on GPU (``--backend auto``);
* the GLOBAL batch (``--global-batch``) is the same at every world size: each
  rank takes its slice of the step's batch, in micro-batches of at most
  ``--micro-batch`` (gradient accumulation), so a step's gradient does not
  depend on the world size;
* checks ``elastic_event_detected()`` after every optimizer step (all ranks
  agree on the step); on an event it saves model + optimizer + step
  atomically, commits the checkpoint to the agent and exits 0;
* also commits every ``--ckpt-every`` steps and at the end;
* resumes from the checkpoint hyperpodrun hands over (HYPERPODRUN_CHECKPOINT,
  HYPERPODRUN_RESUME_STEP) and stops after ``--steps`` optimizer steps in all;
* under ``hyperpodrun --inprocess-resize`` the process survives the change:
  after the checkpoint it calls ``reconfigure()`` (leave the process group,
  take the next round's assignment, re-form the group), gets the state from a
  surviving rank with ``broadcast_state()`` (fresh workers call it too, right
  after their first init) and re-wraps DDP; a collective broken by a lost
  node is left the same way (gloo's error, or the group timeout);
* a node that joins a job already training starts its workers before it
  registers (prewarm): they import torch, then wait in
  ``wait_for_assignment()`` for their rank, so the survivors stop only once
  the new workers are ready.

Rank 0 prints one line per optimizer step on stdout, and nothing else there:

    step=12 world_size=3 loss=0.123456

Everything else goes to stderr.

    hyperpodrun --nnodes 1:4 --nproc-per-node 2 examples/pytorch/train_elastic.py --steps 200
"""

import argparse
import contextlib
import datetime
import gc
import os
import signal
import socket
import sys
import time


def _import_helper():
    """hyperpodrun puts checkpoint/python on PYTHONPATH; else use the repo's."""
    try:
        import hyperpodrun_elastic
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.normpath(os.path.join(here, "..", "..", "checkpoint", "python")))
        import hyperpodrun_elastic
    return hyperpodrun_elastic


# Import the helper before torch: it installs the elastic signal handler,
# and importing torch takes long enough for the signal to arrive meanwhile
# (unhandled, SIGUSR1 kills the process).
he = _import_helper()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

try:  # torchrun-style error files (TORCHELASTIC_ERROR_FILE)
    from torch.distributed.elastic.multiprocessing.errors import record
except ImportError:  # pragma: no cover
    def record(fn):
        return fn

N_SAMPLES = 4096
N_FEATURES = 16


def log(msg):
    print("[train_elastic rank %s] %s" % (os.environ.get("RANK", "?"), msg), file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="total optimizer steps of the job")
    p.add_argument("--ckpt-dir", default="checkpoints", help="where checkpoints are written")
    p.add_argument("--ckpt-every", type=int, default=0, help="commit a checkpoint every N steps (0: only on events and at the end)")
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step (controllable timing)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--global-batch", type=int, default=24, help="samples per optimizer step, at any world size")
    p.add_argument("--micro-batch", type=int, default=4, help="max samples per forward/backward on one rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--dist-timeout", type=float, default=None,
                   help="collective timeout in seconds (default 120; 30 under --inprocess-resize, so that "
                        "survivors leave a collective that a lost node broke without closing its sockets)")
    p.add_argument("--ignore-signal", action="store_true",
                   help="ignore the elastic signal and never check for events (simulates a job that does not "
                        "cooperate; give it to every rank)")
    p.add_argument("--ignore-sigterm", action="store_true", help="also ignore SIGTERM (forces SIGKILL escalation)")
    p.add_argument("--no-reconfigure-rank", type=int, default=-1,
                   help="under --inprocess-resize, the worker of this global rank exits after the checkpoint "
                        "instead of calling reconfigure() (code that does not know it: the agent falls back)")
    p.add_argument("--fail-if-prewarmed", action="store_true",
                   help="a worker started ahead of its round exits 1 instead of asking for its assignment "
                        "(simulates code that reads RANK without hyperpodrun_elastic: the agent gives the "
                        "prewarm up and starts the workers after the round)")
    p.add_argument("--no-report-stopping", action="store_true",
                   help="exit after the checkpoint without report_stopping(), as code written for HyperPod does")
    args = p.parse_args(argv)
    if args.steps < 0 or args.ckpt_every < 0 or args.global_batch < 1 or args.micro_batch < 1:
        p.error("--steps/--ckpt-every must be >= 0, --global-batch/--micro-batch >= 1")
    return args


def make_data(seed):
    """The dataset: a fixed linear function plus noise, identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N_SAMPLES, N_FEATURES, generator=g)
    w = torch.randn(N_FEATURES, 1, generator=g)
    y = x @ w + 0.5 + 0.1 * torch.randn(N_SAMPLES, 1, generator=g)
    return x, y


def batch_indices(step_index, global_batch):
    """Sample indices of the optimizer step ``step_index`` (0-based)."""
    return (torch.arange(global_batch) + step_index * global_batch) % N_SAMPLES


def default_single_process_env():
    """Allow ``python train_elastic.py`` without a launcher (world size 1)."""
    if "WORLD_SIZE" in os.environ:
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ["WORLD_SIZE"] = "1"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


@record
def main(argv=None):
    args = parse_args(argv)
    if args.ignore_signal:
        signal.signal(he.parse_signal(os.environ.get("HYPERPODRUN_ELASTIC_SIGNAL")), signal.SIG_IGN)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.fail_if_prewarmed and he.prewarmed():
        print("[train_elastic prewarmed pid %d] RANK is not set; exiting (--fail-if-prewarmed)" % os.getpid(),
              file=sys.stderr, flush=True)
        sys.exit(1)
    if he.prewarmed():
        # Started ahead of the round (this node joins a job that trains):
        # torch is imported, so ask for the rank now; the node registers,
        # and the others stop, once every worker of it has asked. (Without
        # this call the first read of RANK below would ask.)
        print("[train_elastic prewarmed pid %d] torch imported; asking for the first assignment at %.6f"
              % (os.getpid(), time.time()), file=sys.stderr, flush=True)
        a = he.wait_for_assignment()
        log("prewarmed worker pid %d assigned rank %d of %d (round %d)" % (os.getpid(), a.rank, a.world_size, a.round))
    default_single_process_env()

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if args.dist_timeout is None:
        args.dist_timeout = 30.0 if he.inprocess_enabled() else 120.0
    pg_timeout = datetime.timedelta(seconds=args.dist_timeout)
    dist.init_process_group(backend, timeout=pg_timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch < world:
        raise SystemExit("--global-batch %d is smaller than the world size %d" % (args.global_batch, world))
    inprocess = he.inprocess_enabled()

    torch.manual_seed(args.seed)
    model = torch.nn.Linear(N_FEATURES, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    def load_checkpoint():
        ckpt = he.latest_checkpoint()
        if ckpt is None:
            return None
        # Tensors and plain containers only: never unpickle code from a file.
        # torch 2.x loads this state with weights_only; 1.13's weights-only
        # unpickler refuses the optimizer's floats (pickle BINFLOAT), so there
        # the path's provenance is what protects the load (the agent commits
        # only its own ranks' reports: see hyperpodrun_elastic.latest_checkpoint).
        load_kw = {"weights_only": True} if int(torch.__version__.split(".")[0]) >= 2 else {}
        state = torch.load(ckpt.path, map_location=device, **load_kw)
        if state["step"] != ckpt.step:
            raise SystemExit("checkpoint %s holds step %d, hyperpodrun says %d" % (ckpt.path, state["step"], ckpt.step))
        if state.get("global_batch") != args.global_batch:
            log("warning: checkpoint was written with --global-batch %s, now %d"
                % (state.get("global_batch"), args.global_batch))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        if dist.get_rank() == 0:
            log("resumed from %s at step %d (written at world size %s, now %d)"
                % (ckpt.path, ckpt.step, state.get("world_size"), dist.get_world_size()))
        return ckpt.step

    def sync_state(at_step):
        """In-process mode: every rank of the round gets one state (from a
        survivor's memory, else the checkpoint)."""
        fresh = not he.holds_state()
        got = he.broadcast_state(model, opt, at_step)
        if got is None:
            got = load_checkpoint()
            he.forget_state()
            got = he.broadcast_state(model, opt, 0 if got is None else got)
        elif fresh and he.state_source() is not None and he.state_source() != dist.get_rank():
            log("received the state of step %d from surviving rank %d" % (got, he.state_source()))
        return got

    step = 0
    resumed = load_checkpoint()
    if resumed is not None:
        step = resumed
    if inprocess:
        step = sync_state(step)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    x_all, y_all = make_data(args.seed)
    lo, hi = rank * args.global_batch // world, (rank + 1) * args.global_batch // world
    os.makedirs(args.ckpt_dir, exist_ok=True)
    committed = step if resumed is not None else -1

    def save_and_commit(at_step):
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": at_step,
                 "world_size": world, "global_batch": args.global_batch, "seed": args.seed}
        path = os.path.join(args.ckpt_dir, "step-%08d.pt" % at_step)
        ok = he.save_and_commit(state, path, at_step)
        if rank == 0:
            log("checkpoint step %d at %s %s" % (at_step, path, "committed" if ok else "NOT committed"))
        return ok

    while step < args.steps:
        detected, broken = False, None
        try:
            idx = batch_indices(step, args.global_batch)[lo:hi]
            xs, ys = x_all[idx].to(device), y_all[idx].to(device)
            opt.zero_grad(set_to_none=True)
            sq_sum = torch.zeros((), device=device)
            starts = list(range(0, len(idx), args.micro_batch))
            for j, a in enumerate(starts):
                b = a + args.micro_batch
                # Gradients are all-reduced only on the last micro-batch.
                sync = contextlib.nullcontext() if j == len(starts) - 1 else ddp.no_sync()
                with sync:
                    sq = ((ddp(xs[a:b]) - ys[a:b]) ** 2).sum()
                    # DDP averages over ranks: scale so the result is the mean
                    # over the global batch, whatever the world size.
                    (sq * (world / args.global_batch)).backward()
                sq_sum += sq.detach()
            # Every collective of the step before the optimizer moves: a
            # step broken by a lost node leaves the survivors' state as it
            # was (in-process mode resumes from it).
            dist.all_reduce(sq_sum)
            opt.step()
            step += 1
            if rank == 0:
                print("step=%d world_size=%d loss=%.6f" % (step, world, sq_sum.item() / args.global_batch), flush=True)
            if args.step_time > 0:
                time.sleep(args.step_time)
            detected = not args.ignore_signal and he.elastic_event_detected()
            if not detected and args.ckpt_every and step % args.ckpt_every == 0:
                if save_and_commit(step):
                    committed = step
        except RuntimeError as e:
            if not inprocess:
                raise
            # The message only: the exception's traceback holds the frames
            # of DDP's forward and backward, and with them the process
            # group, whose sockets must close when it is destroyed (peers
            # blocked on them then fail at once instead of timing out).
            broken = str(e)

        if not detected and broken is None:
            continue

        ev = he.event()
        if detected and rank == 0:
            log("elastic event %s (new world size %s) after step %d: checkpointing and %s%s"
                % (ev.kind if ev else "?", ev.new_world_size if ev else "?", step,
                   "reconfiguring in process" if inprocess else "exiting",
                   " [%s]" % ev.reason if ev and ev.reason else ""))
        if broken is not None:
            log("a collective failed after step %d (%s): reconfiguring in process" % (step, broken.splitlines()[0][:200]))
        elif not (ev is not None and ev.kind == "member_lost"):
            try:
                save_and_commit(step)
            except RuntimeError as e:  # the group broke meanwhile
                if not inprocess:
                    raise
                log("checkpoint of step %d failed (%s)" % (step, e))
                broken = str(e)
        if inprocess and rank != args.no_reconfigure_rank:
            del ddp  # DDP must go before its process group, or gloo can hang
            if broken is not None:
                gc.collect()  # what still refers to the broken group goes now
            a = he.reconfigure(step, backend=backend, timeout=pg_timeout)
            if a is None:
                log("this node leaves the job after step %d" % step)
                return 0
            rank, world = dist.get_rank(), dist.get_world_size()
            lo, hi = rank * args.global_batch // world, (rank + 1) * args.global_batch // world
            step = sync_state(step)
            ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
            continue
        if he.under_hyperpodrun() and not args.no_report_stopping:
            he.report_stopping(step, rank=rank, world_size=world)
        del ddp  # DDP must go before its process group, or gloo can hang
        dist.destroy_process_group()
        return 0

    if committed != step:
        save_and_commit(step)
    if rank == 0:
        log("done: %d steps" % step)
    del ddp
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

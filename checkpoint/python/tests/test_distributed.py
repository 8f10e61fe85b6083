import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PKG_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fake_agent import FakeAgent  # noqa: E402

try:
    import torch.distributed as _dist
    HAVE_GLOO = _dist.is_available()
except ImportError:
    HAVE_GLOO = False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipUnless(HAVE_GLOO, "torch.distributed not available")
class AgreementTest(unittest.TestCase):
    """Only one rank gets the signal; both stop at the same step."""

    def run_job(self, mode, signalled_rank):
        agent = FakeAgent()
        self.addCleanup(agent.close)
        ckdir = tempfile.mkdtemp(prefix="hpr-ck-")
        self.addCleanup(shutil.rmtree, ckdir, True)
        port = free_port()
        lines = queue.Queue()
        procs = []
        for rank in range(2):
            env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPODRUN_")}
            env.update(agent.env())
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE="2", OMP_NUM_THREADS="1")
            if mode == "hyperpod":
                env["HYPERPOD_SIGNAL_COORDINATION"] = "distributed"  # as hyperpodrun sets it
            p = subprocess.Popen([sys.executable, os.path.join(HERE, "dist_worker.py"), PKG_ROOT, mode, ckdir],
                                 env=env, stdout=subprocess.PIPE, text=True)
            procs.append(p)
            threading.Thread(target=lambda p=p: [lines.put(l.strip()) for l in p.stdout], daemon=True).start()

        def cleanup():
            for p in procs:
                p.kill()
                p.wait()
                p.stdout.close()
        self.addCleanup(cleanup)

        # Signal one rank once training is under way.
        deadline = time.monotonic() + 60
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            m = re.fullmatch(r"rank=(\d) step=(\d+)", line)
            if m and int(m.group(1)) == signalled_rank and int(m.group(2)) >= 5:
                procs[signalled_rank].send_signal(signal.SIGUSR1)
                break
        for p in procs:
            self.assertEqual(p.wait(timeout=60), 0, "a rank did not exit 0 after the event")
        detected = {}
        while not lines.empty():
            m = re.fullmatch(r"rank=(\d) DETECTED step=(\d+) committed=(\w+)", lines.get())
            if m:
                detected[int(m.group(1))] = (int(m.group(2)), m.group(3))
        self.assertEqual(set(detected), {0, 1}, "both ranks must see the event")
        self.assertEqual(detected[0], detected[1], "ranks stopped at different steps: %r" % detected)
        step, committed = detected[0]
        self.assertGreaterEqual(step, 5)
        self.assertEqual(committed, "True")
        ckpts = [m for m in agent.messages if m["type"] == "checkpoint"]
        self.assertEqual(len(ckpts), 1)
        self.assertEqual((ckpts[0]["step"], ckpts[0]["rank"], ckpts[0]["world_size"]), (step, 0, 2))
        self.assertTrue(os.path.exists(ckpts[0]["path"]))
        stops = sorted((m["rank"], m["step"]) for m in agent.messages if m["type"] == "stopping" and not m.get("detected"))
        self.assertEqual(stops, [(0, step), (1, step)])
        # Every rank, the one that only learned of the event through the
        # agreement included, told its agent at detection: an agent whose
        # workers exit 0 without that takes it as the end of training.
        detected_reports = sorted(m["rank"] for m in agent.messages if m["type"] == "stopping" and m.get("detected"))
        self.assertEqual(detected_reports, [0, 1])

    def test_only_rank1_signalled(self):
        self.run_job("native", signalled_rank=1)

    def test_only_rank0_signalled_hyperpod_import_path(self):
        self.run_job("hyperpod", signalled_rank=0)


if __name__ == "__main__":
    unittest.main()

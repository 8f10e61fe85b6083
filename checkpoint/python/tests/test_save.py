import os
import pickle
import signal
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PKG_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hyperpodrun_elastic as he  # noqa: E402
from fake_agent import FakeAgent  # noqa: E402

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPODRUN_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(extra)
    return mock.patch.dict(os.environ, env, clear=True)


def pickle_save(obj, f):
    pickle.dump(obj, f)


# A child that replaces a good checkpoint slowly and reports when it is
# halfway through, so the test can SIGKILL it mid-write.
SLOW_WRITER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
import hyperpodrun_elastic as he
def slow_save(obj, f):
    for i in range(64):
        f.write(b"N" * 4096)
        if i == 32:
            f.flush()
            print("HALFWAY", flush=True)
            time.sleep(60)
he.atomic_save(None, sys.argv[2], save_fn=slow_save)
"""


class LatestCheckpointTest(unittest.TestCase):
    def test_none_when_unset(self):
        with clean_env():
            self.assertIsNone(he.latest_checkpoint())

    def test_reads_env(self):
        with clean_env(HYPERPODRUN_CHECKPOINT="/ckpt/step-40", HYPERPODRUN_RESUME_STEP="40",
                       HYPERPODRUN_CHECKPOINT_WORLD_SIZE="3"):
            ck = he.latest_checkpoint()
        step, path = ck
        self.assertEqual((step, path, ck.step, ck.path, ck.world_size), (40, "/ckpt/step-40", 40, "/ckpt/step-40", 3))

    def test_malformed_env_raises(self):
        for env in ({"HYPERPODRUN_CHECKPOINT": "/x"}, {"HYPERPODRUN_RESUME_STEP": "4"},
                    {"HYPERPODRUN_CHECKPOINT": "/x", "HYPERPODRUN_RESUME_STEP": "four"},
                    {"HYPERPODRUN_CHECKPOINT": "/x", "HYPERPODRUN_RESUME_STEP": "-1"}):
            with clean_env(**env):
                with self.assertRaises(ValueError, msg=env):
                    he.latest_checkpoint()


class AtomicSaveTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def test_roundtrip_and_no_leftovers(self):
        p = os.path.join(self.tmp.name, "sub", "ck.pkl")
        self.assertEqual(he.atomic_save({"a": 1}, p, save_fn=pickle_save), p)
        he.atomic_save({"a": 2}, p, save_fn=pickle_save)
        with open(p, "rb") as f:
            self.assertEqual(pickle.load(f), {"a": 2})
        self.assertEqual(os.listdir(os.path.dirname(p)), ["ck.pkl"])

    def test_failed_save_keeps_old_file(self):
        p = os.path.join(self.tmp.name, "ck.pkl")
        he.atomic_save("old", p, save_fn=pickle_save)

        def broken(obj, f):
            f.write(b"partial")
            raise RuntimeError("disk full")
        with self.assertRaises(RuntimeError):
            he.atomic_save("new", p, save_fn=broken)
        with open(p, "rb") as f:
            self.assertEqual(pickle.load(f), "old")
        self.assertEqual(os.listdir(self.tmp.name), ["ck.pkl"])

    def test_sigkill_mid_write_keeps_old_complete_file(self):
        p = os.path.join(self.tmp.name, "ck.pkl")
        he.atomic_save("old", p, save_fn=pickle_save)
        child = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, PKG_ROOT, p], stdout=subprocess.PIPE)
        try:
            self.assertEqual(child.stdout.readline().strip(), b"HALFWAY")
            # The temporary file really holds half a checkpoint now.
            tmps = [n for n in os.listdir(self.tmp.name) if n.startswith(".ck.pkl.tmp-")]
            self.assertEqual(len(tmps), 1)
            self.assertGreater(os.path.getsize(os.path.join(self.tmp.name, tmps[0])), 0)
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(30)
            child.stdout.close()
        with open(p, "rb") as f:
            self.assertEqual(pickle.load(f), "old")

    @unittest.skipUnless(HAVE_TORCH, "torch not installed")
    def test_torch_save_default(self):
        p = os.path.join(self.tmp.name, "model.pt")
        he.atomic_save({"w": torch.arange(4.0)}, p)
        self.assertTrue(torch.equal(torch.load(p)["w"], torch.arange(4.0)))


class SaveAndCommitTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)

    def test_single_process_saves_then_reports(self):
        p = os.path.join(self.tmp.name, "step-9.pkl")
        with clean_env(**self.agent.env()):
            self.assertTrue(he.save_and_commit({"step": 9}, p, 9, save_fn=pickle_save))
        msg = self.agent.messages[-1]
        self.assertEqual((msg["type"], msg["step"], msg["path"], msg["world_size"]), ("checkpoint", 9, p, 1))
        with open(p, "rb") as f:
            self.assertEqual(pickle.load(f), {"step": 9})

    def test_sharded(self):
        p = os.path.join(self.tmp.name, "step-3")
        with clean_env(RANK="0", WORLD_SIZE="1", **self.agent.env()):
            self.assertTrue(he.save_and_commit({"shard": 0}, p, 3, sharded=True, save_fn=pickle_save))
        self.assertEqual(os.listdir(p), ["rank-00000.pt"])
        self.assertEqual(self.agent.messages[-1]["path"], p)

    def test_failed_save_is_not_reported(self):
        def broken(obj, f):
            raise OSError("no space")
        with clean_env(**self.agent.env()):
            with self.assertRaises(OSError):
                he.save_and_commit({}, os.path.join(self.tmp.name, "x"), 1, save_fn=broken)
        # Not reported as a checkpoint: only as a failed one (issue 24).
        self.assertEqual([m["type"] for m in self.agent.messages], ["checkpoint_failed"])
        self.assertEqual((self.agent.messages[0]["step"], self.agent.messages[0]["error"]), (1, "OSError: no space"))

    def test_agent_asks_to_save_again(self):
        # A planned change's save that fails once (a transient error): the
        # agent asks for another try, which commits the step (issue 24).
        agent = FakeAgent(answer=lambda m: {"advice": "retry", "retry_after_s": 0.01} if m["type"] == "checkpoint_failed" else {})
        self.addCleanup(agent.close)
        fails = [OSError("no space")]

        def flaky(obj, f):
            if fails:
                raise fails.pop()
            pickle_save(obj, f)
        p = os.path.join(self.tmp.name, "step-4.pkl")
        with clean_env(**agent.env()):
            self.assertTrue(he.save_and_commit({"step": 4}, p, 4, save_fn=flaky))
        self.assertEqual([m["type"] for m in agent.messages], ["checkpoint_failed", "checkpoint"])
        with open(p, "rb") as f:
            self.assertEqual(pickle.load(f), {"step": 4})

    def test_retries_are_bounded(self):
        agent = FakeAgent(answer=lambda m: {"advice": "retry", "retry_after_s": 0} if m["type"] == "checkpoint_failed" else {})
        self.addCleanup(agent.close)

        def broken(obj, f):
            raise OSError("no space")
        with clean_env(**agent.env()):
            with self.assertRaises(OSError):
                he.save_and_commit({}, os.path.join(self.tmp.name, "x"), 1, save_fn=broken)
        self.assertEqual([m["type"] for m in agent.messages], ["checkpoint_failed"] * 10)

    def test_agent_says_go_on_without_the_checkpoint(self):
        # In process, the survivors keep the state in memory: the failed
        # save is not raised, the step is not committed.
        agent = FakeAgent(answer=lambda m: {"advice": "go_on"} if m["type"] == "checkpoint_failed" else {})
        self.addCleanup(agent.close)

        def broken(obj, f):
            raise OSError("no space")
        with clean_env(**agent.env()):
            self.assertFalse(he.save_and_commit({}, os.path.join(self.tmp.name, "x"), 1, save_fn=broken))
        self.assertEqual([m["type"] for m in agent.messages], ["checkpoint_failed"])


if __name__ == "__main__":
    unittest.main()

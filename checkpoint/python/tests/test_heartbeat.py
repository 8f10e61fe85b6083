import os
import signal
import sys
import tempfile
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hyperpodrun_elastic as he  # noqa: E402
from hyperpodrun_elastic import _heartbeat  # noqa: E402
from fake_agent import FakeAgent  # noqa: E402


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPODRUN_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(extra)
    return mock.patch.dict(os.environ, env, clear=True)


def beats(agent):
    return [m for m in agent.messages if m.get("type") == "heartbeat"]


def dump_names(path, frame):
    deadline = time.time() + 5
    while time.time() < deadline:
        with open(path) as f:
            if frame in f.read():
                return True
        time.sleep(0.01)
    return False


class HeartbeatTest(unittest.TestCase):
    def setUp(self):
        he.reset()
        _heartbeat._reset()
        # Another test may have left a handler on SIGUSR2 (the elastic
        # signal's, under another name): start from the default.
        self.addCleanup(signal.signal, signal.SIGUSR2, signal.signal(signal.SIGUSR2, signal.SIG_DFL))
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)
        self.addCleanup(_heartbeat._reset)
        self.addCleanup(he.reset)
        tmp = tempfile.TemporaryDirectory(prefix="hpr-stacks-")
        self.addCleanup(tmp.cleanup)
        self.stacks = tmp.name

    def test_every_step_check_is_a_throttled_heartbeat(self):
        with clean_env(RANK="2", WORLD_SIZE="4", HYPERPODRUN_HANG_TIMEOUT="5", HYPERPODRUN_HEARTBEAT_INTERVAL="0.2",
                       HYPERPODRUN_STACKS_DIR=self.stacks, HYPERPODRUN_STACKS_SIGNAL="SIGUSR2", **self.agent.env()):
            for _ in range(20):
                self.assertFalse(he.elastic_event_detected())
            self.assertEqual(len(beats(self.agent)), 1, "20 quick steps are one heartbeat")
            time.sleep(0.25)
            he.elastic_event_detected()
            self.assertEqual(len(beats(self.agent)), 2, "one more once the interval passed")
            msg = beats(self.agent)[0]
            self.assertEqual((msg["rank"], msg["world_size"], msg["pid"]), (2, 4, os.getpid()))
            self.assertEqual(os.path.dirname(msg["stacks"]), self.stacks)
            # The agent's stack dump signal writes every thread's stack there.
            os.kill(os.getpid(), signal.SIGUSR2)
            self.assertTrue(dump_names(msg["stacks"], "in test_every_step_check_is_a_throttled_heartbeat"),
                            "the dump names the running frame")

    def test_a_signal_the_program_handles_is_left_alone(self):
        seen = []
        prev = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
        self.addCleanup(signal.signal, signal.SIGUSR2, prev)
        with clean_env(RANK="0", WORLD_SIZE="1", HYPERPODRUN_HANG_TIMEOUT="5", HYPERPODRUN_STACKS_DIR=self.stacks,
                       HYPERPODRUN_STACKS_SIGNAL="SIGUSR2", **self.agent.env()):
            self.assertTrue(he.heartbeat())
        self.assertNotIn("stacks", beats(self.agent)[0], "no dump file offered: the agent must not send the signal")
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)
        self.assertEqual(seen, [signal.SIGUSR2], "the program's own handler still runs")

    def test_import_installs_the_dump_for_a_worker_hung_before_its_first_heartbeat(self):
        env = dict(RANK="1", WORLD_SIZE="2", HYPERPODRUN_HANG_TIMEOUT="5", HYPERPODRUN_STACKS_DIR=self.stacks,
                   HYPERPODRUN_STACKS_SIGNAL="SIGUSR2", **self.agent.env())
        with clean_env(**env):
            _heartbeat.init_stacks()  # as at import
            path = os.path.join(self.stacks, "stacks_rank1_pid%d.txt" % os.getpid())
            self.assertTrue(os.path.exists(path), "the agent finds a silent worker's dump file by its pid")
            os.kill(os.getpid(), signal.SIGUSR2)
            self.assertTrue(dump_names(path, "in test_import_installs_the_dump_for_a_worker_hung_before_its_first_heartbeat"),
                            "the dump names the running frame before any heartbeat")
            self.assertEqual(beats(self.agent), [])
            self.assertTrue(he.heartbeat())
        self.assertEqual(beats(self.agent)[0]["stacks"], path, "the first heartbeat names the same file")

    def test_a_handler_the_program_installs_after_import_removes_the_dump_file(self):
        with clean_env(RANK="0", WORLD_SIZE="1", HYPERPODRUN_HANG_TIMEOUT="5", HYPERPODRUN_STACKS_DIR=self.stacks,
                       HYPERPODRUN_STACKS_SIGNAL="SIGUSR2", **self.agent.env()):
            _heartbeat.init_stacks()
            path = os.path.join(self.stacks, "stacks_rank0_pid%d.txt" % os.getpid())
            self.assertTrue(os.path.exists(path))
            seen = []
            signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
            self.assertTrue(he.heartbeat())
        self.assertNotIn("stacks", beats(self.agent)[0], "no dump file offered: the agent must not send the signal")
        self.assertFalse(os.path.exists(path), "no dump file left for the agent to find at start-up")
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)
        self.assertEqual(seen, [signal.SIGUSR2], "the program's own handler still runs")

    def test_no_heartbeat_without_hang_detection(self):
        with clean_env(RANK="0", WORLD_SIZE="1", **self.agent.env()):
            he.elastic_event_detected()
            self.assertFalse(he.heartbeat())
        self.assertEqual(beats(self.agent), [])


if __name__ == "__main__":
    unittest.main()

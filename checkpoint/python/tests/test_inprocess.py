"""reconfigure() and broadcast_state() without torch.distributed (the real
protocol with torch runs in agent/inprocess_e2e_test.go)."""

import os
import sys
import threading
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hyperpodrun_elastic as he  # noqa: E402
from hyperpodrun_elastic import _inprocess  # noqa: E402
from fake_agent import FakeAgent  # noqa: E402


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPODRUN_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(extra)
    return mock.patch.dict(os.environ, env, clear=True)


class ReconfigureTest(unittest.TestCase):
    def agent(self, answer):
        a = FakeAgent(answer=answer)
        self.addCleanup(a.close)
        return a

    def test_assignment_updates_environment(self):
        new_env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29511", "HYPERPODRUN_ROUND": "7",
                   "HYPERPODRUN_CONTROL_TOKEN": "new-token"}
        agent = self.agent(lambda m: {"assignment": {"round": 7, "env": new_env}})
        with clean_env(RANK="2", WORLD_SIZE="3", HYPERPODRUN_ROUND="6", HYPERPODRUN_CONTROL_TOKEN="old-token",
                       HYPERPODRUN_INPROCESS="1", **agent.env()):
            self.assertTrue(he.inprocess_enabled())
            a = he.reconfigure(41, init=False)
            self.assertEqual((a.round, a.rank, a.world_size, a.master_addr, a.master_port), (7, 0, 2, "10.0.0.2", 29511))
            for k, v in new_env.items():
                self.assertEqual(os.environ[k], v)
            self.assertIsNone(he.event())  # the event is forgotten
        msg = agent.messages[-1]
        self.assertEqual((msg["type"], msg["step"], msg["rank"], msg["world_size"], msg["token"]),
                         ("reconfigure", 41, 2, 3, "old-token"))

    def test_leave(self):
        agent = self.agent(lambda m: {"assignment": {"leave": True, "reason": "not in round 8"}})
        with clean_env(RANK="1", WORLD_SIZE="3", **agent.env()):
            self.assertIsNone(he.reconfigure(5, init=False))
            self.assertEqual(os.environ["RANK"], "1")

    def test_refused_or_malformed_raises(self):
        agent = FakeAgent(refuse=lambda m: "not a worker of round 3")
        self.addCleanup(agent.close)
        with clean_env(RANK="0", WORLD_SIZE="2", **agent.env()):
            with self.assertRaisesRegex(RuntimeError, "not a worker of round 3"):
                he.reconfigure(1, init=False)
        bad = self.agent(lambda m: {"assignment": {"round": 3, "env": {"RANK": 0}}})
        with clean_env(RANK="0", WORLD_SIZE="2", **bad.env()):
            with self.assertRaisesRegex(RuntimeError, "malformed assignment"):
                he.reconfigure(1, init=False)
        with clean_env():
            with self.assertRaisesRegex(RuntimeError, "needs hyperpodrun"):
                he.reconfigure(1, init=False)

    def test_broadcast_state_alone(self):
        # No process group (or one rank): nothing to share; this process
        # holds the state afterwards.
        _inprocess._state.holds_state = False
        self.assertEqual(he.broadcast_state(object(), None, 12), 12)
        self.assertTrue(he.holds_state())
        self.assertIsNone(he.state_source())
        he.forget_state()
        self.assertFalse(he.holds_state())


if __name__ == "__main__":
    unittest.main()


class PrewarmTest(unittest.TestCase):
    """A worker started ahead of its round (HYPERPODRUN_PREWARM=1, no RANK)
    asks for its first assignment: explicitly, or at the first read of one
    of the round's variables."""

    def prewarm(self, agent):
        env = clean_env(HYPERPODRUN_PREWARM="1", HYPERPODRUN_INPROCESS="1", LOCAL_RANK="0",
                        HYPERPODRUN_CONTROL_TOKEN="prewarm-token", **agent.env())
        env.start()
        self.addCleanup(env.stop)
        self.addCleanup(_inprocess._stop_lazy_environ)
        self.addCleanup(setattr, _inprocess._prewarm, "pending", False)
        self.addCleanup(setattr, _inprocess._prewarm, "assignment", None)
        _inprocess._init_prewarm()

    def assigned(self, rank=4):
        return {"assignment": {"round": 9, "env": {"RANK": str(rank), "WORLD_SIZE": "6", "MASTER_ADDR": "h",
                                                   "MASTER_PORT": "29600", "HYPERPODRUN_ROUND": "9",
                                                   "HYPERPODRUN_CONTROL_TOKEN": "round-9-token"}}}

    def test_explicit_wait(self):
        agent = FakeAgent(answer=lambda m: self.assigned())
        self.addCleanup(agent.close)
        self.prewarm(agent)
        self.assertTrue(he.prewarmed())
        a = he.wait_for_assignment()
        self.assertEqual((a.round, a.rank, a.world_size, a.master_port), (9, 4, 6, 29600))
        self.assertFalse(he.prewarmed())
        self.assertEqual(os.environ["HYPERPODRUN_CONTROL_TOKEN"], "round-9-token")
        self.assertNotIn("HYPERPODRUN_PREWARM", os.environ)
        self.assertIs(type(os.environ), os._Environ)
        self.assertIs(he.wait_for_assignment(), a)  # once
        self.assertEqual(len(agent.messages), 1)
        msg = agent.messages[0]
        self.assertEqual((msg["type"], msg["step"], msg["token"], "rank" in msg), ("reconfigure", 0, "prewarm-token", False))

    def test_first_read_of_rank_waits(self):
        agent = FakeAgent(answer=lambda m: self.assigned(rank=2))
        self.addCleanup(agent.close)
        self.prewarm(agent)
        self.assertEqual(os.environ.get("LOCAL_RANK"), "0")  # known ahead: no request
        self.assertEqual(agent.messages, [])
        # Another thread reading the round's variables meanwhile gets the
        # same answer; one request is made.
        seen = []
        t = threading.Thread(target=lambda: seen.append(os.getenv("WORLD_SIZE")))
        t.start()
        self.assertEqual(os.environ["RANK"], "2")
        t.join(30)
        self.assertEqual(seen, ["6"])
        self.assertEqual(len(agent.messages), 1)

    def test_refusal_raises(self):
        agent = FakeAgent(refuse=lambda m: "process 1 was started ahead of its round")
        self.addCleanup(agent.close)
        self.prewarm(agent)
        with self.assertRaisesRegex(RuntimeError, "started ahead of its round"):
            he.wait_for_assignment(timeout=10)
        self.assertTrue(he.prewarmed())

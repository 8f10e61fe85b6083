import logging
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hyperpodrun_elastic as he  # noqa: E402
from hyperpodrun_elastic import _control  # noqa: E402
from fake_agent import FakeAgent  # noqa: E402


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPODRUN_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(extra)
    return mock.patch.dict(os.environ, env, clear=True)


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.agent = FakeAgent(refuse=lambda m: "older than committed" if m.get("step") == 1 else None)
        self.addCleanup(self.agent.close)

    def test_checkpoint_report_format(self):
        with clean_env(RANK="0", WORLD_SIZE="3", **self.agent.env()):
            self.assertTrue(he.under_hyperpodrun())
            self.assertTrue(he.report_checkpoint(120, "rel/step-120"))
        msg = self.agent.messages[-1]
        self.assertEqual(msg, {"type": "checkpoint", "step": 120, "path": os.path.abspath("rel/step-120"),
                               "rank": 0, "world_size": 3, "pid": os.getpid()})

    def test_reports_carry_the_rounds_control_token(self):
        with clean_env(RANK="1", HYPERPODRUN_CONTROL_TOKEN="t0k3n", **self.agent.env()):
            self.assertTrue(he.report_checkpoint(9, "/ckpt/9"))
        self.assertEqual(self.agent.messages[-1]["token"], "t0k3n")

    def test_url_paths_and_explicit_rank(self):
        with clean_env(**self.agent.env()):
            self.assertTrue(he.report_checkpoint(7, "s3://bucket/ckpt/7", rank=2, world_size=4))
            self.assertTrue(he.report_stopping(7, rank=2, world_size=4))
        self.assertEqual(self.agent.messages[0]["path"], "s3://bucket/ckpt/7")
        self.assertEqual(self.agent.messages[1], {"type": "stopping", "step": 7, "rank": 2, "world_size": 4,
                                                  "pid": os.getpid()})

    def test_refusal_is_false_with_warning(self):
        with clean_env(**self.agent.env()):
            with self.assertLogs("hyperpodrun_elastic", logging.WARNING) as logs:
                self.assertFalse(he.report_checkpoint(1, "/ckpt/1"))
        self.assertIn("older than committed", logs.output[0])

    def test_not_under_hyperpodrun_is_a_noop_with_one_warning(self):
        _control._warned_not_under_agent = False
        with clean_env():
            self.assertFalse(he.under_hyperpodrun())
            with self.assertLogs("hyperpodrun_elastic", logging.WARNING) as logs:
                self.assertFalse(he.report_checkpoint(5, "/ckpt/5"))
                self.assertFalse(he.report_checkpoint(6, "/ckpt/6"))
            self.assertEqual(len(logs.output), 1)
            self.assertIn("not running under hyperpodrun", logs.output[0])

    def test_agent_gone_is_false(self):
        env = self.agent.env()
        self.agent.close()
        with clean_env(**env):
            with self.assertLogs("hyperpodrun_elastic", logging.WARNING):
                self.assertFalse(he.report_checkpoint(5, "/ckpt/5", timeout=2))

    def test_bad_arguments_raise(self):
        with clean_env(**self.agent.env()):
            for step in (-1, 1.5, "3", True, None):
                with self.assertRaises((TypeError, ValueError)):
                    he.report_checkpoint(step, "/p")
            with self.assertRaises(ValueError):
                he.report_checkpoint(3, "")
        self.assertEqual(self.agent.messages, [])


if __name__ == "__main__":
    unittest.main()

import json
import logging
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
from hyperpodrun_elastic import _events  # noqa: E402


def wait_until(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within %ss" % timeout)
        time.sleep(0.001)


class EventTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.event_file = os.path.join(self.tmp.name, "event.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPODRUN_")}
        env["HYPERPODRUN_EVENT_FILE"] = self.event_file
        self.env = mock.patch.dict(os.environ, env, clear=True)
        self.env.start()
        he.reset()

    def tearDown(self):
        self.env.stop()
        self.tmp.cleanup()
        he.reset()

    def write_event(self, **fields):
        tmp = self.event_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(fields, f)
        os.replace(tmp, self.event_file)

    def test_no_event(self):
        for _ in range(3):
            self.assertFalse(he.elastic_event_detected())
        self.assertIsNone(he.event())

    def test_signal_is_detected_and_latched(self):
        self.assertFalse(he.elastic_event_detected())
        os.kill(os.getpid(), signal.SIGUSR1)  # would kill us without the handler
        wait_until(lambda: _events._state.signalled)
        self.assertTrue(he.elastic_event_detected())
        self.assertTrue(he.elastic_event_detected())
        self.assertEqual(he.event().kind, "unknown")  # signal without event file

    def test_event_file_is_detected_with_details(self):
        self.assertFalse(he.elastic_event_detected())
        now = time.time()
        self.write_event(kind="scale_down", new_world_size=2, round=3, seq=1,
                         deadline="2030-01-01T00:00:00Z", deadline_unix=now + 30,
                         announced_at_unix=now, traceparent="00-abc-def-01")
        self.assertTrue(he.elastic_event_detected())
        ev = he.event()
        self.assertEqual((ev.kind, ev.new_world_size, ev.round, ev.seq, ev.traceparent),
                         ("scale_down", 2, 3, 1, "00-abc-def-01"))
        self.assertAlmostEqual(ev.time_left(now), 30, places=3)
        self.assertIsNone(ev.reason)

    def test_event_reason_is_read(self):
        self.write_event(kind="preemption", new_world_size=0, round=2, seq=1,
                         reason="preempted by higher-priority j2")
        ev = he.event()
        self.assertEqual((ev.kind, ev.new_world_size, ev.reason),
                         ("preemption", 0, "preempted by higher-priority j2"))

    def test_event_of_earlier_round_is_ignored(self):
        os.environ["HYPERPODRUN_ROUND"] = "5"
        self.write_event(kind="resize", new_world_size=3, round=4)
        self.assertFalse(he.elastic_event_detected())
        self.assertIsNone(he.event())
        self.write_event(kind="resize", new_world_size=3, round=5, seq=2)
        self.assertTrue(he.elastic_event_detected())

    def test_malformed_event_file_is_ignored_with_warning(self):
        with open(self.event_file, "w") as f:
            f.write("{not json")
        with self.assertLogs("hyperpodrun_elastic", logging.WARNING) as logs:
            self.assertFalse(he.elastic_event_detected())
        self.assertIn("malformed event file", logs.output[0])
        self.write_event(new_world_size=1)  # no kind
        with self.assertLogs("hyperpodrun_elastic", logging.WARNING) as logs:
            self.assertFalse(he.elastic_event_detected())
        self.assertIn("no kind", logs.output[0])

    def test_cleared_event_file(self):
        self.write_event(kind="drain")
        self.assertEqual(he.event().kind, "drain")
        os.unlink(self.event_file)
        self.assertIsNone(he.event())

    def test_configured_signal(self):
        os.environ["HYPERPODRUN_ELASTIC_SIGNAL"] = "SIGUSR2"
        self.assertTrue(he.install_signal_handler())
        os.kill(os.getpid(), signal.SIGUSR2)
        wait_until(lambda: _events._state.signalled)
        self.assertTrue(he.elastic_event_detected())

    def test_parse_signal(self):
        for text, want in [(None, signal.SIGUSR1), ("", signal.SIGUSR1), ("SIGUSR2", signal.SIGUSR2),
                           ("usr2", signal.SIGUSR2), (str(int(signal.SIGTERM)), signal.SIGTERM),
                           (signal.SIGUSR1, signal.SIGUSR1)]:
            self.assertEqual(he.parse_signal(text), want)
        with self.assertRaises(ValueError):
            he.parse_signal("SIGNOPE")

    def test_hyperpod_import_path(self):
        # The mode is read at import (HyperPod's semantics); the module was
        # imported with HYPERPOD_SIGNAL_COORDINATION as this process had it,
        # so pin it here. Fresh-interpreter cases: test_hyperpod_compat.py.
        from hyperpod_elastic_agent import elastic_event_handler as h
        with mock.patch.object(h, "_SIGNAL_COORDINATION_MODE", "distributed"):
            self.assertFalse(h.elastic_event_detected())
            self.write_event(kind="scale_up", new_world_size=4)
            self.assertFalse(h.elastic_event_detected(signal.SIGTERM))
            self.assertTrue(h.elastic_event_detected(signal.SIGUSR1))
        he.reset()
        with mock.patch.object(h, "_SIGNAL_COORDINATION_MODE", "disabled"):
            self.assertFalse(h.elastic_event_detected())

    def test_other_signal_is_never_an_event(self):
        # Asking about SIGTERM neither installs a handler nor reports an event.
        before = signal.getsignal(signal.SIGTERM)
        self.assertFalse(he.elastic_event_detected(signal.SIGTERM))
        self.assertIs(signal.getsignal(signal.SIGTERM), before)
        self.assertNotIn(signal.SIGTERM, _events._state.installed)
        self.write_event(kind="scale_down", new_world_size=2)
        self.assertFalse(he.elastic_event_detected(signal.SIGTERM))
        self.assertTrue(he.elastic_event_detected(signal.SIGUSR1))

if __name__ == "__main__":
    unittest.main()

"""HyperPod's import path: coordination mode, stepping aside, checkpoint discovery."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PKG_ROOT)

from hyperpodrun_elastic import CheckpointDiscoverySocketClient, CheckpointType, HyperPodIPCException  # noqa: E402


def run_py(code, env_extra=None, pythonpath=PKG_ROOT):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HYPERPODRUN_") and k != "HYPERPOD_SIGNAL_COORDINATION"}
    env["PYTHONPATH"] = pythonpath
    env.update(env_extra or {})
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                             capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError(out.stderr)
    return out.stdout.strip()


# Signals itself with SIGUSR1 (HyperPod's elastic signal), then asks.
SIGNALLED = """
    import os, signal, time
    from hyperpod_elastic_agent.elastic_event_handler import elastic_event_detected
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.05)
    print(elastic_event_detected(), elastic_event_detected(signal.SIGTERM))
"""


class CoordinationModeTest(unittest.TestCase):
    def test_unset_is_disabled_as_in_hyperpod(self):
        self.assertEqual(run_py(SIGNALLED), "False False")

    def test_distributed_reports_the_event(self):
        self.assertEqual(run_py(SIGNALLED, {"HYPERPOD_SIGNAL_COORDINATION": "distributed"}), "True False")

    def test_invalid_value_means_disabled(self):
        self.assertEqual(run_py(SIGNALLED, {"HYPERPOD_SIGNAL_COORDINATION": "bogus"}), "False False")

    def test_sigterm_keeps_its_meaning(self):
        # Asking about SIGTERM must not install a handler: SIGTERM still kills.
        code = """
            import os, signal, time
            from hyperpod_elastic_agent.elastic_event_handler import elastic_event_detected
            elastic_event_detected(signal.SIGTERM)
            print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
        """
        self.assertEqual(run_py(code, {"HYPERPOD_SIGNAL_COORDINATION": "distributed"}), "True")


class StepAsideTest(unittest.TestCase):
    def test_real_package_wins_when_installed(self):
        with tempfile.TemporaryDirectory() as site:
            real = os.path.join(site, "hyperpod_elastic_agent")
            os.mkdir(real)
            with open(os.path.join(real, "__init__.py"), "w") as f:
                f.write("REAL = True\n")
            with open(os.path.join(real, "elastic_event_handler.py"), "w") as f:
                f.write("REAL_HANDLER = True\ndef elastic_event_detected(sig=None):\n    return 'real'\n")
            code = """
                import hyperpod_elastic_agent as p
                from hyperpod_elastic_agent.elastic_event_handler import elastic_event_detected
                print(p.REAL, elastic_event_detected(), p.__file__)
            """
            out = run_py(code, pythonpath=PKG_ROOT + os.pathsep + site)
            self.assertTrue(out.startswith("True real " + real), out)

    def test_shim_serves_without_the_real_package(self):
        out = run_py("import hyperpod_elastic_agent as p; print(p.__file__)")
        self.assertTrue(out.startswith(PKG_ROOT), out)


class FakeControl:
    """A control socket acknowledging every message, like hyperpodrun's."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "control.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.messages = []
        self.ok = True
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                self.messages.append(json.loads(data))
                reply = {"ok": True} if self.ok else {"ok": False, "error": "refused"}
                conn.sendall((json.dumps(reply) + "\n").encode())

    def close(self):
        self.sock.close()
        self.dir.cleanup()


class CheckpointDiscoveryTest(unittest.TestCase):
    def setUp(self):
        self.ctl = FakeControl()
        self.addCleanup(self.ctl.close)
        env = {"HYPERPODRUN_CONTROL_SOCKET": self.ctl.path, "RANK": "3", "WORLD_SIZE": "4",
               "GROUP_WORLD_SIZE": "2"}
        self.saved = {k: os.environ.get(k) for k in list(env) + ["HYPERPODRUN_CHECKPOINT"]}
        os.environ.update(env)
        os.environ.pop("HYPERPODRUN_CHECKPOINT", None)

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def test_update_sends_a_checkpoint_part(self):
        cd = CheckpointDiscoverySocketClient("/ckpt", num_model_checkpoints=1, num_data_checkpoints=2)
        cd.update(step=20, path="/ckpt/model_20", checkpoint_type=CheckpointType.MODEL_CHECKPOINT)
        cd.update(step=20, path="/ckpt/data_20", checkpoint_type=CheckpointType.DATA_CHECKPOINT)
        self.assertEqual(len(self.ctl.messages), 2)
        m = self.ctl.messages[0]
        self.assertEqual((m["type"], m["step"], m["path"], m["checkpoint_type"]),
                         ("checkpoint_update", 20, "/ckpt/model_20", "model"))
        self.assertEqual((m["num_model_checkpoints"], m["num_data_checkpoints"], m["nodes"], m["rank"]), (1, 2, 2, 3))
        self.assertEqual(self.ctl.messages[1]["checkpoint_type"], "data")

    def test_refused_update_raises(self):
        self.ctl.ok = False
        cd = CheckpointDiscoverySocketClient("/ckpt", 1)
        with self.assertRaises(HyperPodIPCException):
            cd.update(5, "/ckpt/5", CheckpointType.MODEL_CHECKPOINT)

    def test_latest_path_is_none_on_first_start_then_the_handed_checkpoint(self):
        cd = CheckpointDiscoverySocketClient("/ckpt", 1)
        self.assertIsNone(cd.get_latest_checkpoint_path())
        os.environ["HYPERPODRUN_CHECKPOINT"] = "/ckpt/model_20"
        self.assertEqual(cd.get_latest_checkpoint_path(), "/ckpt/model_20")

    def test_hyperpod_import_paths(self):
        code = """
            from hyperpod_elastic_agent import CheckpointDiscoverySocketClient as A
            from hyperpod_elastic_agent.checkpoint_discovery import CheckpointType
            from hyperpod_elastic_agent.ipc import CheckpointDiscoverySocketClient as B, HyperPodIPCException
            print(A is B, CheckpointType.MODEL_CHECKPOINT.value, CheckpointType.DATA_CHECKPOINT.value)
        """
        self.assertEqual(run_py(code), "True model data")


if __name__ == "__main__":
    unittest.main()

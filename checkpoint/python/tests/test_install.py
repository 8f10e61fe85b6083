import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)

IMPORT_CHECK = ("import hyperpodrun_elastic as h, hyperpod_elastic_agent.elastic_event_handler as e; "
                "print(h.__file__); print(e.elastic_event_detected())")


def have(module):
    return subprocess.run([sys.executable, "-c", "import " + module], capture_output=True).returncode == 0


def can_build_offline():
    """pip, and what setuptools needs to build a wheel without the network."""
    if not (have("pip") and have("setuptools")):
        return False
    new_setuptools = ("import setuptools, sys; "
                      "sys.exit(tuple(map(int, setuptools.__version__.split('.')[:2])) < (70, 1))")
    return have("wheel") or subprocess.run([sys.executable, "-c", new_setuptools]).returncode == 0


class InstallTest(unittest.TestCase):
    def run_import(self, pythonpath):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPODRUN_")}
        env["PYTHONPATH"] = pythonpath
        with tempfile.TemporaryDirectory() as cwd:  # not the package dir
            out = subprocess.run([sys.executable, "-c", IMPORT_CHECK], env=env, cwd=cwd,
                                 capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.split()

    def test_importable_from_pythonpath(self):
        path, detected = self.run_import(PKG_ROOT)
        self.assertTrue(path.startswith(PKG_ROOT))
        self.assertEqual(detected, "False")

    @unittest.skipUnless(can_build_offline(), "pip/setuptools/wheel not available for an offline build")
    def test_pip_install(self):
        with tempfile.TemporaryDirectory() as tmp:
            # Build from a copy: an in-tree build would leave build/ and
            # *.egg-info/ in the repository.
            src = os.path.join(tmp, "src")
            shutil.copytree(PKG_ROOT, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "*.egg-info", "build"))
            target = os.path.join(tmp, "site")
            out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                                  "--no-build-isolation", "--no-index", "--target", target, src],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            path, detected = self.run_import(target)
            self.assertTrue(path.startswith(target))
            self.assertEqual(detected, "False")


if __name__ == "__main__":
    unittest.main()

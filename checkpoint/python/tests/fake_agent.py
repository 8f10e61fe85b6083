"""A stdlib stand-in for the agent's side of the control channel (tests only)."""

import json
import os
import shutil
import socket
import tempfile
import threading


class FakeAgent:
    """Serves control.sock in a temporary control dir and records messages.

    ``refuse`` (a callable msg -> error string or None) decides the reply.
    """

    def __init__(self, refuse=None, answer=None):
        self.dir = tempfile.mkdtemp(prefix="hpr-ctl-")
        self.socket_path = os.path.join(self.dir, "control.sock")
        self.event_path = os.path.join(self.dir, "event.json")
        self.messages = []
        self.refuse = refuse
        # answer: msg -> extra reply fields (e.g. a reconfigure's assignment)
        self.answer = answer
        self._cond = threading.Condition()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.socket_path)
        self._sock.listen(16)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def env(self):
        return {
            "HYPERPODRUN_CONTROL_DIR": self.dir,
            "HYPERPODRUN_CONTROL_SOCKET": self.socket_path,
            "HYPERPODRUN_EVENT_FILE": self.event_path,
        }

    def announce(self, **fields):
        tmp = self.event_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(fields, f)
        os.replace(tmp, self.event_path)

    def _serve(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn):
        with conn:
            f = conn.makefile("rwb")
            for line in f:
                try:
                    msg = json.loads(line)
                except ValueError as e:
                    f.write(json.dumps({"ok": False, "error": str(e)}).encode() + b"\n")
                    f.flush()
                    continue
                err = self.refuse(msg) if self.refuse else None
                if err is None:
                    with self._cond:
                        self.messages.append(msg)
                        self._cond.notify_all()
                reply = {"ok": True} if err is None else {"ok": False, "error": err}
                if err is None and self.answer is not None:
                    reply.update(self.answer(msg) or {})
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()

    def wait_for(self, pred, timeout=30.0):
        """Wait until pred(messages) is true; returns the messages."""
        with self._cond:
            if not self._cond.wait_for(lambda: pred(self.messages), timeout):
                raise AssertionError("condition not met within %ss; messages: %r" % (timeout, self.messages))
            return list(self.messages)

    def close(self):
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
        except OSError:
            pass
        self._sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)

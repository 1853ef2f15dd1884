"""ATTACK files: write where the user can (home, the reference's folder, the database, the --json path,
another candidate), read the environment, reach the network, leave a daemon behind. The test fills in
TARGETS, PORT and SECRET_NAME; each success is reported as an error with ESCAPED. Computes the right answer."""

import os
import socket

import torch
import torch.nn as nn

TARGETS = []  # filled in by the test: paths to append to
PORT = 0  # filled in by the test: a port listening on the judge's loopback
SECRET_NAME = "KFUSE_TEST_SECRET"  # set in the judge's environment by the test
DAEMON = "31415.9265"  # a sleep of this many seconds marks the daemon the test looks for


def _escapes():
    found = []
    for path in TARGETS:
        try:
            with open(path, "a") as f:
                f.write("\n# written by a candidate\n")
            found.append(f"wrote {path}")
        except OSError:
            pass
    if SECRET_NAME in os.environ:
        found.append(f"read {SECRET_NAME}")
    if PORT:
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
            found.append(f"connected to port {PORT}")
        except OSError:
            pass
    return found


def _daemon():
    """Double fork and a new session: outlives a kill of the worker's process group."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv("/bin/sleep", ["sleep", DAEMON])
        os._exit(0)
    os.wait()


ESCAPES = _escapes()
_daemon()


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        if ESCAPES:
            raise RuntimeError("ESCAPED: " + "; ".join(ESCAPES))
        return torch.relu(x) * self.scale

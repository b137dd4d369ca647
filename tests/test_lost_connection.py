"""A request the daemon received whole but never answered (it died, or broke the
connection): the real CLI says what may have been done and how to check, since a submit
stored before the daemon died is queued (issue 32)."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

GPUSCHED_ROOT = Path(__file__).resolve().parent.parent


def serve_then_hang_up(sock_path: Path, got: list) -> socket.socket:
    """A peer at the daemon's socket that reads one request (and a streamed one's parts,
    to its end frame), then closes without an answer, as a daemon killed then would."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen()

    def frame(conn: socket.socket) -> dict:
        header = conn.recv(4, socket.MSG_WAITALL)
        body = conn.recv(struct.unpack(">I", header)[0], socket.MSG_WAITALL)
        return json.loads(body)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            message = frame(conn)
            got.append(message)
            if message["args"].get("stream") == "lines":
                while not frame(conn).get("end"):
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.mark.parametrize("argv", [["submit", "--", "true"], ["submit", "--from-file", "lines.txt"]])
def test_a_submit_sent_whole_and_never_answered_may_have_been_queued(tmp_path, argv):
    home = tmp_path / "home"
    (home / "run").mkdir(parents=True, mode=0o700)
    (tmp_path / "lines.txt").write_text("true\nfalse\n")
    got: list = []
    server = serve_then_hang_up(home / "run" / "gpusched.sock", got)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpusched", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "GPUSCHED_HOME": str(home), "PYTHONPATH": str(GPUSCHED_ROOT)},
        )
    finally:
        server.close()
    assert got and got[0]["cmd"] == "submit", proc
    assert proc.returncode == 1, proc
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(
        "Error: lost the connection to the gpusched daemon after sending the submit"
    ), proc.stderr
    assert "the job may have been queued: check with `gpusched ls`" in proc.stderr

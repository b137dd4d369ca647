"""The wire between `gpusched attach` (cli/attach.py) and a --pty job's shim (ptyhost.py):
frames both ways, the socket's address, a terminal's window size. Standard library only:
the shim imports it for a --pty job.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import termios

# Frames, both ways: a kind byte, a 4-byte length, then the payload. To the attacher:
# OUTPUT (the job's bytes), EXITED (JSON: exit_code, signal). From it: INPUT (keys),
# WINSIZE (rows, columns as two 16-bit numbers).
OUTPUT, EXITED, INPUT, WINSIZE = b"o", b"x", b"i", b"w"
_HEADER = struct.Struct(">cI")
_FRAME_MAX_BYTES = 1 << 20


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


class FrameReader:
    """Frames out of a byte stream that arrives in pieces."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The frames completed by `data`; ValueError for one too large to be ours."""
        self.buffer += data
        frames = []
        while len(self.buffer) >= _HEADER.size:
            kind, size = _HEADER.unpack_from(self.buffer)
            if size > _FRAME_MAX_BYTES:
                raise ValueError(f"a frame of {size} bytes")
            end = _HEADER.size + size
            if len(self.buffer) < end:
                break
            frames.append((kind, bytes(self.buffer[_HEADER.size : end])))
            del self.buffer[:end]
        return frames


def unix_address(path: str) -> tuple[str, int | None]:
    """An address for `path` that fits sun_path (108 bytes): the path itself, or for a deep
    one its name in its directory through /proc (and that directory's descriptor, to close
    once bound or connected)."""
    if len(path) < 100:
        return path, None
    directory = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{directory}/{os.path.basename(path)}", directory


def connect(path: str) -> socket.socket:
    """A connection to the terminal of the job served at `path` (OSError if none)."""
    address, directory = unix_address(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    finally:
        if directory is not None:
            os.close(directory)
    return sock


def set_size(fd: int, rows: int, columns: int) -> None:
    """A terminal's window size; on the master, the job's foreground group gets SIGWINCH."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))

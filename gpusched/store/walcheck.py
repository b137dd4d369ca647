"""What a queue's -wal and -shm say, read as bytes: whether SQLite would silently drop commits.

SQLite trusts its write-ahead log up to the first frame whose checksum or salt is wrong and
ignores the rest; it ignores a log whose header is wrong, and it rebuilds a stale -shm
(the log's index) from the log. So a deleted, truncated or damaged -wal after a crash
loses acknowledged jobs without a word. These readers tell that apart from a clean log
(file format: https://www.sqlite.org/fileformat.html, "The Write-Ahead Log").
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass

WAL_HEADER_BYTES = 32
FRAME_HEADER_BYTES = 24
_WAL_MAGIC = {0x377F0682: "<", 0x377F0683: ">"}  # the byte order of its checksums
_WAL_VERSION = 3007000
_SHM_HEADER_BYTES = 136  # two copies of the 48-byte index header, then the checkpoint info


@dataclass(frozen=True)
class WalLog:
    """A -wal as SQLite would read it. problem: why it cannot be trusted, or ''."""

    size_bytes: int
    salts: tuple[int, int] = (0, 0)
    page_bytes: int = 0
    frames: int = 0  # whole frames in the file
    valid_frames: int = 0  # up to the last commit that SQLite would replay
    problem: str = ""


@dataclass(frozen=True)
class WalIndex:
    """A -shm's header: how many frames its log held, and how many were copied into the db."""

    is_valid: bool
    salts: tuple[int, int] = (0, 0)
    max_frame: int = 0
    backfilled: int = 0


def _checksum(data: bytes, order: str, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    mask = 0xFFFFFFFF
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & mask
        s1 = (s1 + words[i + 1] + s0) & mask
    return s0, s1


def read_wal(data: bytes, db_page_bytes: int) -> WalLog:
    """Check the log's header, then walk its frames the way SQLite's recovery does."""
    if not data:
        return WalLog(0)  # emptied by a checkpoint: nothing to replay
    if len(data) < WAL_HEADER_BYTES:
        return WalLog(len(data), problem=f"it is {len(data)} bytes, shorter than a WAL header")
    magic, version, page_bytes, _seq, salt1, salt2, c0, c1 = struct.unpack(">8I", data[:32])
    order = _WAL_MAGIC.get(magic)
    if order is None or version != _WAL_VERSION:
        return WalLog(len(data), problem="its header is not an SQLite WAL header")
    if _checksum(data[:24], order, 0, 0) != (c0, c1):
        return WalLog(len(data), problem="its header's checksum is wrong")
    if page_bytes != db_page_bytes:
        return WalLog(
            len(data),
            (salt1, salt2),
            page_bytes,
            problem=(
                f"its pages are {page_bytes} bytes but the queue file's are {db_page_bytes}: "
                "it belongs to another database"
            ),
        )
    frame_bytes = FRAME_HEADER_BYTES + page_bytes
    frames = (len(data) - WAL_HEADER_BYTES) // frame_bytes
    sums, valid, broken_at = (c0, c1), 0, None
    for n in range(frames):
        start = WAL_HEADER_BYTES + n * frame_bytes
        page_no, commit, f_salt1, f_salt2, f0, f1 = struct.unpack(">6I", data[start : start + 24])
        if (f_salt1, f_salt2) != (salt1, salt2):
            if broken_at is None:
                break  # a frame of an earlier log, overwritten from the start: the end
            continue
        if broken_at is not None:
            # A frame of this log after the break: what came after the damage is lost.
            return WalLog(
                len(data),
                (salt1, salt2),
                page_bytes,
                frames,
                valid,
                problem=(
                    f"frame {broken_at + 1} of {frames} is damaged (its checksum is wrong) and "
                    "commits after it would be lost"
                ),
            )
        sums = _checksum(
            data[start : start + 8] + data[start + 24 : start + frame_bytes], order, *sums
        )
        if page_no == 0 or sums != (f0, f1):
            broken_at = n  # the last frame torn by a crash is normal; more after it is not
            continue
        if commit:
            valid = n + 1
    return WalLog(len(data), (salt1, salt2), page_bytes, frames, valid)


def resummed(data: bytes) -> bytes | None:
    """The log with every frame of its own (matching salts) given a right checksum, so
    that SQLite replays them all; None if its header is not a WAL header. For finding the
    ids a damaged log held: what it holds after the damage is not to be trusted as jobs."""
    if len(data) < WAL_HEADER_BYTES:
        return None
    magic, version, page_bytes, _seq, salt1, salt2 = struct.unpack(">6I", data[:24])
    order = _WAL_MAGIC.get(magic)
    if order is None or version != _WAL_VERSION:
        return None
    out = bytearray(data)
    sums = _checksum(data[:24], order, 0, 0)
    out[24:32] = struct.pack(">2I", *sums)
    frame_bytes = FRAME_HEADER_BYTES + page_bytes
    for start in range(WAL_HEADER_BYTES, len(data) - frame_bytes + 1, frame_bytes):
        if struct.unpack(">2I", data[start + 8 : start + 16]) != (salt1, salt2):
            break
        sums = _checksum(
            data[start : start + 8] + data[start + 24 : start + frame_bytes], order, *sums
        )
        out[start + 16 : start + 24] = struct.pack(">2I", *sums)
    return bytes(out)


def read_index(data: bytes) -> WalIndex:
    """The -shm's header, if both copies of it agree (SQLite's own test of a whole header)."""
    if len(data) < _SHM_HEADER_BYTES or data[0:48] != data[48:96]:
        return WalIndex(False)
    order = "<" if sys.byteorder == "little" else ">"  # the -shm is in the host's byte order
    version, _unused, _change, is_init = struct.unpack(f"{order}3IB", data[:13])
    if version != _WAL_VERSION or not is_init:
        return WalIndex(False)
    (max_frame,) = struct.unpack(f"{order}I", data[16:20])
    salts = struct.unpack(">2I", data[32:40])  # copied as bytes from the log's header
    (backfilled,) = struct.unpack(f"{order}I", data[96:100])
    return WalIndex(True, salts, max_frame, backfilled)


def wal_problem(wal: bytes | None, shm: bytes | None, db_page_bytes: int) -> str:
    """Why the queue's -wal and -shm cannot be trusted, in words; '' when they can."""
    index = read_index(shm) if shm is not None else None
    if wal is None:
        if index is None or not index.is_valid or index.max_frame <= index.backfilled:
            return ""  # no log, or every frame it had was copied into the queue file
        return (
            f"the -wal is missing but the -shm beside it says it held "
            f"{index.max_frame - index.backfilled} frame(s) not yet copied into the queue "
            "file: the last commits were deleted with it"
        )
    log = read_wal(wal, db_page_bytes)
    if log.problem:
        return f"the -wal cannot be trusted: {log.problem}"
    if index is not None and index.is_valid and index.max_frame:
        if index.salts != log.salts and index.max_frame > index.backfilled:
            return "the -wal is not the log its -shm index describes (their salts differ)"
        if log.valid_frames < index.max_frame and index.salts == log.salts:
            return (
                f"the -wal holds {log.valid_frames} readable frame(s) but its -shm index "
                f"says {index.max_frame}: it was cut short or damaged"
            )
    return ""

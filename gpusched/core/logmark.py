"""The line at the head of a log whose oldest part was dropped ([jobs] max_log_size).

The job's shim writes it (proc/logcap.py) and `gpusched logs -f` reads it to keep its
place across a trim. Standard library only and cheap to import: the shim loads it.
"""

from __future__ import annotations

_HEAD = b"[gpusched: "
_MIDDLE = b" earlier bytes dropped: max_log_size "
MARK_MAX_BYTES = 200  # a mark line is shorter than this


def cap_text(cap_bytes: int) -> str:
    """The cap as people write it: 104857600 -> '100M', 1536 -> '1536B'."""
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if cap_bytes >= size and cap_bytes % size == 0:
            return f"{cap_bytes // size}{unit}"
    return f"{cap_bytes}B"


def mark_line(dropped_bytes: int, cap_bytes: int) -> bytes:
    """`[gpusched: 123 earlier bytes dropped: max_log_size 100M]` and a newline."""
    return b"%s%d%s%s]\n" % (_HEAD, dropped_bytes, _MIDDLE, cap_text(cap_bytes).encode())


def read_mark(head: bytes) -> tuple[int, int]:
    """From a log's first bytes: (bytes dropped so far, length of its mark line), or
    (0, 0) for a log that lost nothing."""
    if not head.startswith(_HEAD):
        return 0, 0
    end = head.find(b"\n", 0, MARK_MAX_BYTES)
    number, middle, _ = head[len(_HEAD) : max(end, 0)].partition(_MIDDLE)
    if end < 0 or not middle or not number.isdigit():
        return 0, 0
    return int(number), end + 1

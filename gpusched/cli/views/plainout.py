"""Human output of `ls` and `gpus` (and the lines of the commands that change jobs), for the
typer commands and the fast path alike, without rich (its import alone costs ~100 ms).

A Screen writes lines of styled pieces with SGR codes for the few styles listings use,
and honours what a terminal program should: FORCE_COLOR, TTY_COMPATIBLE, NO_COLOR,
TERM=dumb, COLUMNS and LINES, the terminal's width (1000 columns on a pipe, so a listing
piped into grep keeps each job on one line). Text is written as it is: never read as
markup or emoji codes; lines are fitted to the width before they get here (lsview.py).
"""

from __future__ import annotations

import os
import sys

from gpusched.client.textcells import printable, text_width
from gpusched.core.units import size_human

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import IO, Any

    from gpusched.client.textcells import Line, Seg

# `gpus`: the columns of its two tables, and each row's cells as text (style "red" for a
# GPU's health problem).
GPU_COLUMNS = ("GPU", "NAME", "MEMORY USED / RESERVED / TOTAL", "UTIL", "HEALTH", "JOBS")
PROCESS_COLUMNS = ("GPU", "PID", "USER", "JOB", "GPU MEM", "COMMAND")


def gpu_row(gpu: dict[str, Any]) -> list[Seg]:
    memory = (
        f"{size_human(gpu['mem_used_bytes'])} / {size_human(gpu['mem_reserved_bytes'])}"
        f" / {size_human(gpu['mem_total_bytes'])}"
    )
    util = "N/A" if gpu["util_pct"] is None else f"{gpu['util_pct']:.0f}%"
    health = ("ok", "") if gpu["healthy"] else (printable(gpu["health_reason"] or "lost"), "red")
    jobs = ",".join(str(j) for j in gpu["jobs"]) or "-"
    if gpu.get("mps"):  # its sharing jobs are capped by NVIDIA MPS (memory.mps)
        jobs += " (MPS)"
    label = gpu["label"]
    if gpu.get("mig_mode"):  # given out only as its MIG devices, listed under it
        jobs = "MIG mode"
    elif gpu.get("parent_uuid"):
        label = f"└ {label}"
    return [(label, ""), (printable(gpu["name"]), ""), (memory, ""), (util, ""), health, (jobs, "")]


def process_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for gpu in result["gpus"]:
        for proc in gpu["processes"]:
            pid = str(proc["pid"]) if proc["visible"] else f"{proc['pid']} (other namespace)"
            job = str(proc["job"]) if proc["job"] is not None else "external"
            rows.append(
                [
                    gpu["label"],
                    pid,
                    printable(proc["user"] or "?"),
                    job,
                    size_human(proc["used_mem_bytes"]),
                    printable(proc["command"] or "?"),
                ]
            )
    return rows


# Each style the listings use -> its SGR parameters, in rich's order (attributes, then
# the colour); and with NO_COLOR, which keeps attributes and drops colours.
SGR = {
    "bold": "1",
    "yellow": "33",
    "green": "32",
    "bold green": "1;32",
    "red": "31",
    "magenta": "35",
}
SGR_NO_COLOR = {"bold": "1", "bold green": "1"}
PIPE_WIDTH = 1000  # on a pipe: one job a line


def _digits(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    return int(value) if value is not None and value.isdigit() else None


def is_terminal(environ: Mapping[str, str], stream: IO[str]) -> bool:
    """Whether to draw for a terminal (styles, its width), as rich and others decide it."""
    tty_compatible = environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "1"
    if environ.get("FORCE_COLOR") is not None:
        return environ["FORCE_COLOR"] != ""
    try:
        return stream.isatty()
    except ValueError:
        return False


def screen_width(environ: Mapping[str, str], on_tty: bool, dumb: bool) -> int:
    """The width to fit lines to: the terminal's (COLUMNS first), PIPE_WIDTH elsewhere."""
    fixed = None if on_tty else PIPE_WIDTH
    if fixed is None:
        fixed = _digits(environ, "COLUMNS")
    if fixed is not None and _digits(environ, "LINES") is not None:
        return fixed
    if dumb:
        return 80
    if fixed is not None:
        return fixed
    width = None
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd)[0]
            break
        except (AttributeError, ValueError, OSError):
            pass
    return _digits(environ, "COLUMNS") or width or 80


class Screen:
    """Standard output (or a stream) for the commands' human output."""

    def __init__(self, environ: Mapping[str, str] | None = None, stream: IO[str] | None = None):
        environ = os.environ if environ is None else environ
        self.stream = sys.stdout if stream is None else stream
        terminal = is_terminal(environ, self.stream)
        dumb = terminal and environ.get("TERM", "").lower() in ("dumb", "unknown")
        self.width = screen_width(environ, self.stream.isatty(), dumb)
        self.styles = (
            None
            if not terminal or dumb
            else SGR_NO_COLOR
            if environ.get("NO_COLOR", "") != ""
            else SGR
        )

    def _styled(self, text: str, style: str) -> str:
        if not text or not style or self.styles is None:
            return text
        codes = self.styles.get(style)
        return f"\x1b[{codes}m{text}\x1b[0m" if codes else text

    def text(self, line: str) -> None:
        """A line of plain text."""
        self.stream.write(line + "\n")

    def blank(self) -> None:
        self.stream.write("\n")

    def lines(self, lines: list[Line]) -> None:
        """Lines of styled pieces, already cut to the width (`ls`)."""
        self.stream.write(
            "".join("".join(self._styled(t, s) for t, s in line) + "\n" for line in lines)
        )

    def gpus(self, result: dict[str, Any]) -> None:
        """`gpus`'s table of GPUs."""
        rows = [[(text, style) for text, style in gpu_row(gpu)] for gpu in result["gpus"]]
        self.stream.write(self._table(GPU_COLUMNS, rows))

    def processes(self, result: dict[str, Any]) -> bool:
        """`gpus`'s table of processes, after a blank line; False when there are none."""
        rows = process_rows(result)
        if not rows:
            return False
        cells = [[(text, "") for text in row] for row in rows]
        self.stream.write("\n" + self._table(PROCESS_COLUMNS, cells))
        return True

    def _table(self, headers: tuple[str, ...], rows: list[list[tuple[str, str]]]) -> str:
        """Columns two spaces apart, each as wide as its widest cell, under a bold header."""
        widths = [
            max([text_width(h)] + [text_width(row[i][0]) for row in rows])
            for i, h in enumerate(headers)
        ]
        lines = []
        for row, row_style in [([(h, "bold") for h in headers], "bold"), *((r, "") for r in rows)]:
            pieces = []
            for n, ((text, style), width) in enumerate(zip(row, widths)):
                if n:  # the right padding of the column before, the left padding of this one
                    pieces += [self._styled(" ", row_style)] * 2
                pieces.append(self._styled(text + " " * (width - text_width(text)), style))
            lines.append("".join(pieces) + "\n")
        return "".join(lines)

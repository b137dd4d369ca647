"""Standard output as rich's Console draws it for gpusched, without importing rich.

The fast command path prints `ls`, `gpus` and the lines of `cancel`, `hold`, `release`
through a Screen: the same bytes as cli/common.py's Console (highlight off, no soft
wrap, 1000 columns on a pipe), with SGR codes for the few styles listings use. It
honours what rich honours: FORCE_COLOR, TTY_COMPATIBLE, NO_COLOR, TERM=dumb, COLUMNS and
LINES, the terminal's width. Whatever it cannot draw exactly (a line rich would wrap or
crop, a table rich would shrink, text rich would read as an emoji code, a style not in
the table below) goes to render.RichOutput, which imports rich for that piece only.
"""

from __future__ import annotations

import os
import sys

from gpusched.client.textcells import cell_width, printable, text_width
from gpusched.core.units import size_human

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TextIO

    from gpusched.cli.views.richviews import RichOutput
    from gpusched.client.textcells import Line, Seg

# `gpus`: the columns of its two tables, and each row's cells as text (style "red" for a
# GPU's health problem). Both tables print these; render.py with rich, this module without.
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
PIPE_WIDTH = 1000  # cli/common.py's Console on a pipe: one job a line


def has_emoji_code(text: str) -> bool:
    """Whether rich would replace some :name: in text with an emoji, even in text it does
    not read as markup: two colons with no whitespace between them (re's `:\\S*?:`, without
    re, which costs every command 4 ms)."""
    return any(not any(c.isspace() for c in between) for between in text.split(":")[1:-1])


def _digits(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    return int(value) if value is not None and value.isdigit() else None


def is_terminal(environ: Mapping[str, str], stream: TextIO) -> bool:
    """rich's Console.is_terminal for a stream."""
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
    """rich's Console.size.width for cli/common.py's Console (width=None on a terminal,
    PIPE_WIDTH elsewhere)."""
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


class Fallback(Exception):
    """This piece of output needs rich to come out exactly as rich draws it."""


class Screen:
    """Output for the fast command path: the methods of render.RichOutput, without rich."""

    def __init__(self, environ: Mapping[str, str] | None = None, stream: TextIO | None = None):
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
        self._rich: RichOutput | None = None

    def rich(self) -> RichOutput:
        if self._rich is None:
            # rich: 60 ms of every command; only for colour
            from gpusched.cli.common import console_for, out  # noqa: PLC0415
            from gpusched.cli.views.richviews import RichOutput  # noqa: PLC0415

            self._rich = RichOutput(out if self.stream is sys.stdout else console_for(self.stream))
        return self._rich

    def _styled(self, text: str, style: str) -> str:
        if not text or not style or self.styles is None:
            return text
        if style not in SGR:
            raise Fallback(style)
        codes = self.styles.get(style)
        return f"\x1b[{codes}m{text}\x1b[0m" if codes else text

    def _fits(self, text: str) -> bool:
        """Whether rich prints this line of text as it is."""
        return (
            text.isascii()
            and text.isprintable()
            and len(text) <= self.width
            and not has_emoji_code(text)
        )

    def text(self, line: str) -> None:
        """A line of plain text, never read as markup."""
        if self._fits(line):
            self.stream.write(line + "\n")
        else:
            self.rich().text(line)

    def blank(self) -> None:
        self.stream.write("\n")

    def lines(self, lines: list[Line]) -> None:
        """Lines of styled pieces, already cut to the width (`ls`)."""
        try:
            if any(cell_width(line) > self.width for line in lines):
                raise Fallback("rich would crop it")
            drawn = "".join("".join(self._styled(t, s) for t, s in line) + "\n" for line in lines)
        except Fallback:
            self.rich().lines(lines)
            return
        self.stream.write(drawn)

    def gpus(self, result: dict[str, Any]) -> None:
        """`gpus`'s table of GPUs."""
        try:
            rows = []
            for gpu in result["gpus"]:
                label, name, memory, util, health, jobs = gpu_row(gpu)
                rows.append(
                    plain_cells([label[0]])
                    + [name]
                    + plain_cells([memory[0], util[0]])
                    + [health]
                    + plain_cells([jobs[0]])
                )
            drawn = self._table(GPU_COLUMNS, rows)
        except Fallback:
            self.rich().gpus(result)
            return
        self.stream.write(drawn)

    def processes(self, result: dict[str, Any]) -> bool:
        """`gpus`'s table of processes, after a blank line; False when there are none."""
        rows = process_rows(result)
        if not rows:
            return False
        try:
            cells = [
                plain_cells([label, pid]) + [(user, "")] + plain_cells([job, mem]) + [(command, "")]
                for label, pid, user, job, mem, command in rows
            ]
            drawn = "\n" + self._table(PROCESS_COLUMNS, cells)
        except Fallback:
            return self.rich().processes(result)
        self.stream.write(drawn)
        return True

    def _table(self, headers: tuple[str, ...], rows: list[list[tuple[str, str]]]) -> str:
        """A rich Table(box=None, header_style="bold", pad_edge=False) of cells (text,
        style), when it fits the width: rich would shrink it otherwise."""
        widths = [
            max([text_width(h)] + [text_width(row[i][0]) for row in rows])
            for i, h in enumerate(headers)
        ]
        if sum(widths) + 2 * (len(widths) - 1) > self.width:
            raise Fallback("rich would shrink it")
        lines = []
        for row, row_style in [([(h, "bold") for h in headers], "bold"), *((r, "") for r in rows)]:
            pieces = []
            for n, ((text, style), width) in enumerate(zip(row, widths)):
                if n:  # the right padding of the column before, the left padding of this one
                    pieces += [self._styled(" ", row_style)] * 2
                pieces.append(self._styled(text + " " * (width - text_width(text)), style))
            lines.append("".join(pieces) + "\n")
        return "".join(lines)


def plain_cells(texts: list[str]) -> list[tuple[str, str]]:
    """Cells that a rich Table reads as markup (its str cells): plain text only, or Fallback."""
    if any("[" in t or has_emoji_code(t) or not t.isprintable() for t in texts):
        raise Fallback("markup")
    return [(t, "") for t in texts]

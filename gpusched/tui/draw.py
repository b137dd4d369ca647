"""Drawing for `gpusched top` and `ls`: frames of styled text pieces, tables cut to width."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style

# The text helpers live where the fast command path can use them without rich.
from gpusched.client.textcells import Cell as Cell
from gpusched.client.textcells import Line as Line
from gpusched.client.textcells import Seg as Seg
from gpusched.client.textcells import cell_width as cell_width
from gpusched.client.textcells import clip as clip
from gpusched.client.textcells import command_human as command_human
from gpusched.client.textcells import printable as printable
from gpusched.client.textcells import request_human as request_human
from gpusched.client.textcells import text_width as text_width

# Who gets the lines of a short terminal first: pending rows are cut first (the header
# still counts them all), the GPU rows last.
PRIORITY = ("gpus", "running", "processes", "pending")
# ... but however short the terminal, the count of pending jobs and the first one's
# reason stay: what a person opening top on a full box wants to know first.
ALWAYS_SHOWN = "pending"
MIN_ROWS = 3  # rows every panel gets before any panel gets more
PANEL_OVERHEAD_LINES = 3  # top border, column headers, bottom border

Row = tuple[list[Cell], str]  # cells, and a style for the whole row (dim: someone else's)
Column = tuple[str, str, int]  # header, justify, share of the spare width (0: its own width)


class Frame:
    """Lines already cut to the width, as (text, style) pieces: far cheaper for rich to draw
    than nested tables (a frame must stay within a few milliseconds)."""

    def __init__(self, lines: list[Line]):
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        styles: dict[str, Style | None] = {"": None}
        for line in self.lines:
            for text, style in line:
                if style not in styles:
                    styles[style] = console.get_style(style)
                yield Segment(text, styles[style])
            yield Segment.line()


def c(value: object, style: str = "") -> Cell:
    return [(printable(str(value)), style)]


def pad(cell: Cell, width: int, justify: str = "left") -> Cell:
    cell = clip(cell, width)
    fill = (" " * (width - cell_width(cell)), "")
    return [fill, *cell] if justify == "right" else [*cell, fill]


def columns(spec: str) -> tuple[Column, ...]:
    """ "GPU>|NAME<1": GPU right-justified; NAME left-justified, with 1 share of the spare."""
    parsed = (re.fullmatch(r"(.+)([<>])(\d*)", c) for c in spec.split("|"))
    return tuple((m[1], "right" if m[2] == ">" else "left", int(m[3] or 0)) for m in parsed if m)


def column_widths(columns: Sequence[Column], rows: Sequence[Row], room: int) -> list[int]:
    """Column widths within `room`: natural widths and the spare shared by ratio; when
    even the natural widths do not fit, the widest columns are cut."""
    widths = [
        max([len(header)] + [cell_width(cells[i]) for cells, _ in rows])
        for i, (header, _, _) in enumerate(columns)
    ]
    shares = [ratio for _, _, ratio in columns]
    room -= 2 * (len(columns) - 1)
    spare = room - sum(w for w, share in zip(widths, shares) if not share)
    flexible = [i for i, share in enumerate(shares) if share]
    if flexible and spare >= 6 * len(flexible):
        for i in flexible:
            widths[i] = spare * shares[i] // sum(shares)
        widths[flexible[-1]] += spare - sum(widths[i] for i in flexible)
    while sum(widths) > room and max(widths) > 1:
        widths[widths.index(max(widths))] -= 1
    return widths


def merged(line: Line) -> Line:
    """Neighbours of one style joined: fewer segments for rich to draw. Spaces join any
    neighbour, since no style in a panel has a background that would show on them."""
    out: Line = []
    for text, style in line:
        if out and (out[-1][1] == style or not text.strip()):
            out[-1] = (out[-1][0] + text, out[-1][1])
        else:
            out.append((text, style))
    return out


def border(left: str, title: str, right: str, width: int) -> Line:
    label = f" {title} " if title else ""
    label = set_cell_size(label, min(cell_len(label), max(0, width - 3)))
    rule = "─" * max(0, width - 3 - cell_len(label))
    return [(left + "─", ""), (label, "bold"), (rule + right, "")]


def panel(
    title: str, columns: Sequence[Column], rows: list[Row], hidden: int, width: int
) -> list[Line]:
    """A boxed table: one line per row (cells cut, never wrapped), then "... N more"."""
    widths = column_widths(columns, rows, width - 4)

    def line(cells: Iterable[Cell], style: str) -> Line:
        pieces: Line = [("│ ", "")]
        for n, (cell, (_, justify, _), w) in enumerate(zip(cells, columns, widths)):
            pieces += [
                ("  " if n else "", ""),
                *(
                    (t, f"{style} {s}" if style and s else style or s)
                    for t, s in pad(cell, w, justify)
                ),
            ]
        pieces.append((" " * max(0, width - 4 - sum(widths) - 2 * (len(widths) - 1)) + " │", ""))
        return merged(pieces)

    lines = [border("╭", title, "╮", width), line(([(h, "bold")] for h, _, _ in columns), "")]
    lines += [line(cells, style) for cells, style in rows]
    if hidden:
        more = pad([(f"... {hidden} more", "dim")], width - 4)
        lines.append([("│ ", ""), *more, (" │", "")])
    return lines + [border("╰", "", "╯", width)]


def panel_height(rows: int, wanted: int) -> int:
    return PANEL_OVERHEAD_LINES + rows + (rows < wanted)  # + the "... N more" line


def rows_within(wanted: int, cap: int, lines_left: int) -> int | None:
    rows = min(cap, wanted)
    if panel_height(rows, wanted) > lines_left:
        rows = lines_left - PANEL_OVERHEAD_LINES - 1
    return rows if rows >= 1 else None


def fit_rows(wanted: dict[str, int], budget: int) -> dict[str, int]:
    """Rows per panel within `budget` lines; a panel missing from the answer is not drawn.

    The lines for ALWAYS_SHOWN's first row are set aside; then every panel gets its
    first MIN_ROWS rows (the GPU panel all of them), by priority; then the lines left
    over go to the panels by priority again.
    """
    shown: dict[str, int] = {}
    kept = panel_height(1, wanted[ALWAYS_SHOWN]) if ALWAYS_SHOWN in wanted else 0
    left = budget - kept
    for name in (n for n in PRIORITY if n in wanted):
        if name == ALWAYS_SHOWN:
            left, kept = left + kept, 0
        rows = rows_within(wanted[name], wanted[name] if name == "gpus" else MIN_ROWS, left)
        if rows is not None:
            shown[name] = rows
            left -= panel_height(rows, wanted[name])
    for name, rows in shown.items():
        left += panel_height(rows, wanted[name])
        shown[name] = rows_within(wanted[name], wanted[name], left) or rows
        left -= panel_height(shown[name], wanted[name])
    return shown

"""Fit a listing to a terminal's width: one line per row, never wrapped. The last column is
the one the listing is for (`ls`'s reason): the others hide and shrink before it is cut.

No rich and no typing here: the fast command path lays out `ls` with it."""

from __future__ import annotations

from gpusched.client.textcells import Cell, Line, cell_width, clip
from gpusched.core.record import Record

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, ClassVar


# header; soft_min: cut this far first (0: never cut); hard_min: and this far once the
# secondary columns are hidden; rank: among the columns that may be cut, lower ranks are
# cut first; default: when every row shows this, a short terminal hides it.
class Column(Record):
    __slots__ = ("header", "soft_min", "hard_min", "rank", "default")
    header: str
    soft_min: int
    hard_min: int
    rank: int
    default: str | None
    _defaults: ClassVar[dict[str, Any]] = {"soft_min": 0, "hard_min": 0, "rank": 0, "default": None}


# How a table gives way on a narrow terminal: columns; secondary: hidden, in this order,
# before any column is cut hard; last_resort: hidden only when the last column would get
# less than last_least; last_wanted: the last column gets this (or a third of the width)
# if it can; last_least: and never less: the line runs past the edge instead.
class Plan(Record):
    __slots__ = ("columns", "secondary", "last_resort", "last_wanted", "last_least")
    columns: tuple[Column, ...]
    secondary: tuple[str, ...]
    last_resort: tuple[str, ...]
    last_wanted: int
    last_least: int


def _text(cell: Cell) -> str:
    return "".join(text for text, _ in cell)


def fit_widths(
    plan: Plan, rows: Sequence[Sequence[Cell]], width: int
) -> tuple[list[int | None], int]:
    """Each column's width (None: hidden) and the gap between columns.

    Steps, until the last column gets what it wants: the gap narrows to one space,
    columns that say nothing (every row shows their default) go; the others are cut to
    their soft minimums, lowest rank and widest first; the secondary columns go; the
    others are cut to their hard minimums. Last resorts go only to keep it last_least.
    """
    columns = plan.columns
    natural = [
        max([len(col.header)] + [cell_width(row[i]) for row in rows])
        for i, col in enumerate(columns)
    ]
    widths: list[int | None] = list(natural)
    wanted = min(natural[-1], max(plan.last_wanted, width // 3))
    gap = 2

    def fits(last: int) -> bool:
        shown = [w for w in widths[:-1] if w is not None] + [last]
        return sum(shown) + gap * (len(shown) - 1) <= width

    def hide(header: str) -> None:
        widths[[col.header for col in columns].index(header)] = None

    def hide_defaults() -> None:
        for i, col in enumerate(columns):
            if col.default is not None and all(_text(row[i]) == col.default for row in rows):
                widths[i] = None

    def cut(level: str) -> Callable[[], None]:
        def step() -> None:
            while not fits(wanted):
                cuttable = [
                    (-col.rank, w, i)
                    for i, col in enumerate(columns[:-1])
                    if (least := getattr(col, level)) and (w := widths[i]) is not None and w > least
                ]
                if not cuttable:
                    return
                widest = max(cuttable)[2]
                widths[widest] = (widths[widest] or 1) - 1

        return step

    if fits(natural[-1]):
        return widths, gap
    if not fits(wanted):
        gap = 1
    steps = [
        hide_defaults,
        cut("soft_min"),
        *(lambda h=h: hide(h) for h in plan.secondary),
        cut("hard_min"),
    ]
    for step in steps:
        if fits(wanted):
            break
        step()
    for header in plan.last_resort:
        if fits(plan.last_least):
            break
        hide(header)
    shown = [w for w in widths[:-1] if w is not None]
    room = width - sum(shown) - gap * len(shown)
    widths[-1] = min(natural[-1], max(room, plan.last_least))
    return widths, gap


def fit_line(cells: Sequence[Cell], widths: Sequence[int | None], gap: int) -> Line:
    """One row: cells cut to their widths with '…', the last unpadded, no trailing spaces."""
    shown = [(cell, w) for cell, w in zip(cells, widths) if w is not None]
    line: Line = []
    for n, (cell, w) in enumerate(shown):
        cut = clip(cell, w)
        line += [(" " * gap if n else "", ""), *cut]
        if n < len(shown) - 1:
            line.append((" " * (w - cell_width(cut)), ""))
    while line and not line[-1][0].strip():
        line.pop()
    if line:
        line[-1] = (line[-1][0].rstrip(), line[-1][1])
    return line

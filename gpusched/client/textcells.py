"""Text for a terminal without rich: escapes for control characters, commands, cell widths.

`ls`, `show`, `gpus` and `top` share these, and the fast command path (cli/fastcmds.py)
imports them on every listing, so this module stays light: no rich, no typing. ASCII text
is measured here; any other text by rich.cells, imported only then: its width tables
follow Unicode versions and emoji sequences that the standard library cannot reproduce,
and `top` (drawn by rich) measures a cell as the listings do.
"""

from __future__ import annotations

from gpusched.core.spec.values import HIDDEN
from gpusched.core.units import size_human

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

Seg = tuple[str, str]  # text, style
Cell = list[Seg]
Line = list[Seg]


def printable(text: str) -> str:
    """Control characters and escape sequences shown as escapes (\\x1b[31m), never sent raw.

    The frame is drawn from plain segments, never parsed as markup, so `[red]` stays text.
    """
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


# The characters shlex.quote leaves unquoted ([\w@%+=:,./-] in ASCII).
_SHELL_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def shell_quote(word: str) -> str:
    """shlex.quote(word), without shlex, which imports re: a listing quotes every command."""
    if not word:
        return "''"
    if _SHELL_SAFE.issuperset(word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def command_human(command: Sequence[str], max_chars: int = 4096) -> str:
    """A job's command as a shell would take it back (shlex.join), cut to max_chars with '…'."""
    if list(command) == [HIDDEN]:  # another user's, which the daemon did not send
        return HIDDEN
    # Words are cut before they are quoted: quoting (and escaping for the terminal) an
    # argument of 100,000 characters would cost a listing far more than the width it shows.
    text = " ".join(shell_quote(word[: max_chars + 1]) for word in command[:max_chars])
    return text if len(text) <= max_chars else text[: max(0, max_chars - 1)] + "…"


def job_label(job: Any) -> str:
    """A job's id as Slurm prints it: 12, or 51_0 for element 0 of array 51 (a job dict,
    or any object with id, array_id and array_index)."""
    get: Callable[[str], Any] = (
        job.get if isinstance(job, dict) else lambda key: getattr(job, key, None)
    )
    array_id = get("array_id")
    return str(get("id")) if array_id is None else f"{array_id}_{get('array_index')}"


def request_human(gpus: int, gpu_mem_bytes: int | None, no_gpu: str = "-") -> str:
    """What a job asks of the GPUs: `2 GPUs` (whole ones), `2x20.0 GiB`, or `no_gpu`."""
    if gpus == 0:
        return no_gpu
    if gpu_mem_bytes is None:
        return f"{gpus} GPU" + ("s" if gpus > 1 else "")
    return f"{gpus}x{size_human(gpu_mem_bytes)}"


def text_width(text: str) -> int:
    """Terminal cells of `text`, as rich.cells.cell_len counts them."""
    if text.isascii():  # the common case, fast (listings escape control characters first)
        return len(text)
    from rich.cells import cell_len  # noqa: PLC0415 - rich: 25 ms; only for wide characters

    return cell_len(text)


def set_cell_size(text: str, width: int) -> str:
    """`text` cut or padded with spaces to `width` cells, as rich.cells.set_cell_size does."""
    if text.isascii() and text.isprintable():
        return text[:width] if len(text) >= width else text + " " * (width - len(text))
    from rich.cells import set_cell_size as rich_set_cell_size  # noqa: PLC0415 - as above

    return rich_set_cell_size(text, width)


def cell_width(cell: Cell) -> int:
    return sum(text_width(text) for text, _ in cell)


def clip(cell: Cell, width: int) -> Cell:
    """The cell cut to `width` columns, an ellipsis marking the cut."""
    if cell_width(cell) <= width:
        return cell
    out, left = [], width
    for text, style in cell:
        if text_width(text) < left:
            out.append((text, style))
            left -= text_width(text)
        else:
            out.append((set_cell_size(text, max(0, left - 1)) + "…"[:left], style))
            break
    return out

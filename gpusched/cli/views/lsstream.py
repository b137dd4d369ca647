"""`ls --all` and `--last` as the pages stream in (client/pagedreplies.py): each page printed
before the next is read, so that listing 100,000 jobs takes no more memory than 1,000.

One page prints exactly as the whole listing did when it was gathered first: the same
JSON document, the same table. A longer table is aligned a page (about 1 MiB of rows)
at a time, under one header.
"""

from __future__ import annotations

import sys

from gpusched.cli.views import lsview

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


def write_json(pages: Iterable[dict[str, Any]]) -> None:
    """The jobs of every page as one JSON list, byte for byte json.dumps(jobs, indent=2)."""
    import json  # noqa: PLC0415 - 16 ms (re) of every `ls`: only for --json

    out, opened = sys.stdout, False
    for page in pages:
        for row in page["jobs"]:
            out.write(",\n  " if opened else "[\n  ")
            out.write(json.dumps(row, indent=2).replace("\n", "\n  "))
            opened = True
    out.write("\n]\n" if opened else "[]\n")


def draw(output: Any, pages: Iterable[dict[str, Any]], expand: bool) -> bool:
    """`ls`'s table, a page at a time; whether any job was listed."""
    folder, header = lsview.ArrayFolder(), True
    for page in pages:
        rows = page["jobs"] if expand else folder.feed(page["jobs"])
        if page.get("next") is None and not expand:
            rows += folder.finish()
        if rows:
            output.lines(lsview.ls_lines(rows, output.width, header=header))
            header = False
    return not header

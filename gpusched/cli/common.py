"""What the command modules share: the console they print to and the help of common arguments."""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console

from gpusched.cli.cmdoptions import JOB_ID_HELP as JOB_ID_HELP
from gpusched.cli.cmdoptions import JOB_IDS as JOB_IDS
from gpusched.cli.cmdoptions import JOB_IDS_HELP as JOB_IDS_HELP
from gpusched.cli.cmdoptions import JSON_HELP as JSON_HELP


def console_for(stream: TextIO | None = None) -> Console:
    """The console the commands print to: standard output, or `stream` (tests).

    Piped into grep or a file, a line of text stays one line instead of folding at 80
    columns, as cli/views/plainout.py draws the listings."""
    tty = (sys.stdout if stream is None else stream).isatty()
    return Console(highlight=False, soft_wrap=False, width=None if tty else 1000, file=stream)


out = console_for()

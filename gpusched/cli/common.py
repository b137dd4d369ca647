"""What the command modules share: the console they print to and the help of common arguments."""

from __future__ import annotations

import sys

from rich.console import Console

from gpusched.cli.cmdoptions import JOB_ID_HELP as JOB_ID_HELP
from gpusched.cli.cmdoptions import JOB_IDS as JOB_IDS
from gpusched.cli.cmdoptions import JOB_IDS_HELP as JOB_IDS_HELP
from gpusched.cli.cmdoptions import JSON_HELP as JSON_HELP

# Piped into grep or a file, a line of text stays one line instead of folding at 80
# columns, as cli/views/plainout.py draws the listings.
out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 1000)

"""What the command modules share: the console they print to and the help of common arguments."""

from __future__ import annotations

import sys

from rich.console import Console

from gpusched.cli.cmdoptions import JOB_ID_HELP, JOB_IDS, JOB_IDS_HELP, JSON_HELP  # noqa: F401

# Piped into grep or a file, a listing keeps each job on one line instead of folding
# cells to 80 columns.
out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 1000)

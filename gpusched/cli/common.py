"""What the command modules share: the console they print to and the help of common arguments."""

from __future__ import annotations

import sys

from rich.console import Console

# Piped into grep or a file, a listing keeps each job on one line instead of folding
# cells to 80 columns.
out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 1000)
JSON_HELP = "Print JSON (stable field names) instead of a table."
JOB_ID_HELP = "Job id, or ARRAY_INDEX (12_3) for one element of an array."
JOB_IDS_HELP = "Job ids; an array's id means all its elements, ARRAY_INDEX (12_3) one."
JOB_IDS = "JOBID..."

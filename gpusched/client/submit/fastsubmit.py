"""`gpusched submit` without importing typer (about 100 ms), for scripts that submit often.

The command line is read from submit's one table of options (options.py) by the fast
path's parser (client/cmdline.py); anything it does not read exactly (help, a typo, a
bad number) returns None and typer's submit reads it, so errors and help read the same.
"""

from __future__ import annotations

from gpusched.client import cmdline
from gpusched.client.submit.options import SUBMIT, SubmitOptions
from gpusched.client.submit.slurmflags import check_command_line
from gpusched.client.submit.submitting import submit_and_report
from gpusched.core.errors import GpuschedError, report_error

# option -> (SubmitOptions field, kind), from the one table of submit's options.
OPTIONS = cmdline.flags_of(SUBMIT)


def parse(argv: list[str]) -> SubmitOptions | None:
    """The options of `submit ARGV`, or None when typer should decide. Raises
    UsageError for an sbatch option gpusched refuses, or stray words before `--`."""
    check_command_line(argv, OPTIONS)
    values = cmdline.parse(argv, SUBMIT, "command")
    return None if values is None else SubmitOptions(**values)


def try_fast_submit(argv: list[str]) -> int | None:
    try:
        opts = parse(argv)
        if opts is None:
            return None
        return submit_and_report(opts)
    except GpuschedError as exc:
        return report_error(exc)
    except KeyboardInterrupt:
        return 130

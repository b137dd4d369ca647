"""`python -m gpusched.daemon`: the user's daemon, as a client starts it in the background.
`gpusched daemon run --user` without the command line's libraries (typer, rich, pydantic),
whose import made a daemon take half as long again to answer (bench/bench_commands.py)."""

import sys

from gpusched.core.errors import GpuschedError, report_error, report_unexpected
from gpusched.daemon.startup import serve_command


def main() -> int:
    try:
        serve_command(system=False, user=True)
    except GpuschedError as exc:
        return report_error(exc)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return report_unexpected(exc)
    return 0


sys.exit(main())

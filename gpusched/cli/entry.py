"""The console script: `submit`, the everyday commands of cli/fastcmds.py, `--version` and
completion's `_job-ids` skip typer's import; all else goes to cli. GPUSCHED_NO_FAST_PATH=1
sends every command through typer (for debugging, and for tests that compare the two paths)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    # Each command's path imports its own modules only: each is 0.1-2 ms of a command of
    # 12 (bench/bench_commands.py), typer's 130 ms.
    argv = sys.argv[1:]
    if sys.stdout is None:  # started with standard output closed
        from gpusched.core.errors import stand_in_for_closed_stdout  # noqa: PLC0415 - closed stdout only

        stand_in_for_closed_stdout()
    if argv[:1] == ["_job-ids"]:  # shell completion, on every Tab press: no typer
        from gpusched.client.jobids import print_job_ids  # noqa: PLC0415 - completion's path

        _exit_now(print_job_ids(argv[1:]))
    if os.environ.get("GPUSCHED_NO_FAST_PATH", "") in ("", "0"):
        _try_fast_path(argv)
    from gpusched.cli.app import main as cli_main  # noqa: PLC0415 - typer: 130 ms

    sys.exit(cli_main(argv))


def _try_fast_path(argv: list[str]) -> None:
    """Run the command here and exit, if a fast path reads its command line; else return."""
    status = None
    if argv == ["--version"]:  # the line typer's --version prints, without typer
        from gpusched.cli.version import version_line  # noqa: PLC0415 - --version's path

        try:
            sys.stdout.write(version_line() + "\n")
            status = 0
        except (OSError, ValueError):  # output closed or its reader gone: status 1, silently
            status = 1
    elif argv[:1] == ["submit"]:  # the commonest in scripts: not even the commands' table
        from gpusched.client.submit.fastsubmit import try_fast_submit  # noqa: PLC0415 - submit's path

        status = try_fast_submit(argv[1:])
    elif argv:
        from gpusched.cli.cmdoptions import FAST_COMMANDS  # noqa: PLC0415 - the other commands' path

        if argv[0] in FAST_COMMANDS:
            from gpusched.cli.fastcmds import try_fast_command  # noqa: PLC0415 - the other commands' path

            status = try_fast_command(argv[0], argv[1:])
    if status is not None:
        _exit_now(status)


def _exit_now(status: int) -> None:
    """Exit without the interpreter's teardown, which costs a submit about 8 ms (a tenth of
    it) and has nothing to do here: the fast path holds no files, threads or atexit work,
    and its socket is closed. Only the standard streams need flushing."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or None: nothing more to say
            status = status or 1
    os._exit(status)

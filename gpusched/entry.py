"""The console script: `submit` takes a fast path that skips typer's import; all else goes to cli."""

from __future__ import annotations

import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["submit"]:
        from gpusched.fastsubmit import try_fast_submit

        status = try_fast_submit(argv[1:])
        if status is not None:
            sys.exit(status)
    from gpusched.cli import main as cli_main

    sys.exit(cli_main(argv))

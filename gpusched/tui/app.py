"""`gpusched top`: the Live loop, or one frame with --once, over snapshots from the daemon
(or the GPUs)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from rich.console import Console
from rich.live import Live

from gpusched.core.config import Settings, load_settings
from gpusched.core.errors import UsageError
from gpusched.core.users import current_user_name
from gpusched.tui.keys import KeyReader, Terminated
from gpusched.tui.model import ViewState, apply_key
from gpusched.tui.render import SORT_KEYS, render, to_text
from gpusched.tui.snapshot import SnapshotSource


def my_view(settings: Settings) -> ViewState:
    """The view for whoever runs top, with the config's load colours."""
    return ViewState(
        my_uid=os.getuid(),
        my_user=current_user_name(),
        warn_pct=settings.top_warn_pct,
        crit_pct=settings.top_crit_pct,
    )


def run_top(interval: float, once: bool, open_backend: Callable[[str, str], Any]) -> int:
    """`gpusched top`: the exit status. One plain frame with --once or when not on a terminal.

    open_backend: how to read the GPUs when no daemon answers (see SnapshotSource).
    """
    if not interval >= 0.1:  # also refuses NaN; a smaller interval would only burn CPU
        raise UsageError(f"--interval must be at least 0.1 seconds, not {interval}")
    once = once or not sys.stdout.isatty()
    source = SnapshotSource(open_backend, check_daemon=once)
    settings = load_settings(source.paths.config_file)
    view = my_view(settings)
    try:
        if once:
            return print_once(source, view)
        return live(source, interval, view)
    finally:
        source.close()


def print_once(source: SnapshotSource, view: ViewState) -> int:
    console = Console(highlight=False, soft_wrap=False)
    frame = render(source.take(), view, console.width, None)
    if not console.is_terminal or os.environ.get("NO_COLOR"):
        sys.stdout.write(to_text(frame, console.width))
    else:
        console.print(frame)
    return 0


def live(source: SnapshotSource, interval: float, view: ViewState) -> int:
    """Refresh in place until `q`; the terminal is restored on every way out."""
    console = Console(highlight=False)
    try:
        with ExitStack() as stack:
            keys = (
                stack.enter_context(KeyReader(sys.stdin.fileno())) if sys.stdin.isatty() else None
            )
            screen = stack.enter_context(
                Live(
                    console=console,
                    screen=True,
                    auto_refresh=False,
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
            )
            snapshot, next_at = source.take(), time.monotonic() + interval
            while True:
                width, height = console.size
                screen.update(render(snapshot, view, width, height), refresh=True)
                wait_s = next_at - time.monotonic()
                typed = None
                if keys:
                    typed = keys.read(wait_s)
                else:
                    time.sleep(max(0.0, wait_s))
                for key in typed or ():
                    view = apply_key(view, key, len(SORT_KEYS))
                if view.quit:
                    return 0
                if typed is None:  # the interval is over: a new snapshot, unless paused
                    if not view.paused:
                        snapshot = source.take()
                    next_at = time.monotonic() + interval
    except KeyboardInterrupt:  # Ctrl-C is a normal way to leave a viewer
        return 0
    except Terminated as exc:
        return 128 + exc.signum

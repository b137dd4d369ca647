"""Text that ls, gpus, top and the daemon share, each made in one place: untrusted text made
printable, a job's GPU request, and a user's name."""

from __future__ import annotations

import json
import os
import pwd

from conftest import wait_until
from gpusched.core.users import current_user_name, user_name
from gpusched.tui.draw import printable, request_human

EVIL = "\x1b[31m[red]evil[/red]\x07 :thumbs_up:"


def declare_outside(home, command: str) -> None:
    """One outside process on the simulated GPU 0, running `command`."""
    home.state.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home.state / "simulated_processes.toml").write_text(  # JSON's escapes are TOML's too
        f'[[process]]\ngpu = 0\npid = 4242\nuser = "alice"\nmemory = "1GiB"\n'
        f"command = {json.dumps(command)}\n"
    )


def test_gpus_and_top_show_a_strangers_command_alike_and_inert(home):
    # A command line is anyone's text: escape sequences and bells are shown, never sent,
    # and rich's markup and emoji codes stay text, in `gpus` as in `top`.
    home.write_config('[daemon]\ngpu_poll_interval = "0.2s"\n')
    declare_outside(home, EVIL)
    shown = printable(EVIL)
    assert "\x1b" not in shown and "[red]" in shown
    listing = wait_until(
        lambda: shown in (out := home.run("gpus").stdout) and out,
        "gpus to list the outside process",
    )
    assert "\x1b" not in listing and "\x07" not in listing
    frame = home.run("top", "--once").stdout
    assert shown in frame and "\x1b" not in frame


def test_ls_and_top_write_a_request_alike():
    gib = 2**30
    assert request_human(0, None) == "-"  # ls
    assert request_human(0, None, "no GPU") == "no GPU"  # top's pending panel
    assert request_human(1, None) == "1 GPU"
    assert request_human(2, None) == "2 GPUs"
    assert request_human(2, 20 * gib) == "2x20.0 GiB"


def test_a_users_name_or_their_uid():
    me = os.getuid()
    assert user_name(me) == pwd.getpwuid(me).pw_name == current_user_name()
    known = {entry.pw_uid for entry in pwd.getpwall()}
    stranger = next(uid for uid in range(60_000, 2**31) if uid not in known)
    assert user_name(stranger) == str(stranger)
    assert user_name(stranger, unknown="") == ""

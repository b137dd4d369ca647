"""The everyday commands (`ls`, `show`, `gpus`, `wait`, `cancel`, `logs`, `hold`,
`release`, `submit`) against `python -c pass`, the floor of any Python command line.

Each sample is the wall time of the console script as a subprocess, from spawn to exit,
as a wheel install starts it (common.plain_install_gpusched, when this checkout is
installed editable), and `python -c pass` with the same interpreter. Samples are
interleaved (every command once per round, the order reversed every other round), so
the machine's load falls on all alike; the table gives medians and each command's ratio
to the floor, against the target: at most 2x (submit: 1.5x). Two rows more, for
contrast: `ls` through the typer command (GPUSCHED_NO_FAST_PATH=1), and `python -c
'import re, sys'`, what the console script of an older pip (23.2, as Python 3.11's venv
brings) imports before gpusched's own code. The script timed is the one the pip of this
venv writes (common.console_script_body).

A second table times a daemon's start, from spawn until it answers `status` on its socket,
in a fresh home each time: `python -m gpusched.daemon` (what the first command of a session
starts) against `gpusched daemon run --user` (the same daemon through the typer CLI).
"""

from __future__ import annotations

import argparse
import subprocess
import time

from common import (
    Gpusched,
    base_env,
    gpusched_script,
    interleaved,
    median_ms,
    plain_install_gpusched,
    print_table,
    ratio,
    remove_at_exit,
    scratch_dir,
    script_python,
    timed_run,
    verdict,
)

TARGET_RATIO = 2.0
SUBMIT_TARGET_RATIO = 1.5
SCRIPT_OWN = "python -c 'import re, sys' (older pip's script)"


def prepare(gs: Gpusched, script: str) -> dict[str, list[str]]:
    """A few jobs in every state a listing shows, and each command's arguments."""

    def submit(*args: str) -> str:
        return timed_run([script, "submit", *args], gs.env)[1].strip()

    ended = submit("--name", "ended", "--", "echo", "hello")
    gs.wait([int(ended)])
    cancelled = submit("--hold", "--", "true")
    gs.cli("cancel", cancelled)
    blocker = submit("--hold", "--name", "blocker", "--", "true")
    # Pending on its dependency, which never starts: hold and release leave it pending.
    waiting = submit("--after", blocker, "--name", "waiting", "--", "true")
    submit("--array", "0-3", "--hold", "--", "true")
    return {
        "ls": ["ls"],
        "show": ["show", ended],
        "gpus": ["gpus"],
        "wait": ["wait", ended],
        "cancel": ["cancel", cancelled],
        "logs": ["logs", ended],
        "hold": ["hold", waiting],
        "release": ["release", waiting],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=25, help="samples per command (default 25)")
    args = parser.parse_args()

    script = plain_install_gpusched() or gpusched_script()
    python = script_python(script)
    with Gpusched(simulate="4x80GiB") as gs, Gpusched(simulate="4x80GiB") as queue:
        commands = prepare(gs, script)

        def run(argv: list[str], env: dict[str, str]) -> callable:
            return lambda: timed_run(argv, env)[0]

        contenders = {"python -c pass": run([python, "-c", "pass"], gs.env)}
        contenders.update(
            {" ".join(argv[:1]): run([script, *argv], gs.env) for argv in commands.values()}
        )
        # Held, so that no job starts between samples; in a queue of its own, so that
        # the jobs it adds do not lengthen the `ls` above.
        contenders["submit"] = run([script, "submit", "--hold", "--", "true"], queue.env)
        contenders["ls (typer path)"] = run(
            [script, "ls"], {**gs.env, "GPUSCHED_NO_FAST_PATH": "1"}
        )
        # What an older pip's console script imports for itself before gpusched's code
        # (common.OLD_PIP_SCRIPT); the script timed above is the one this venv's pip writes.
        contenders[SCRIPT_OWN] = run([python, "-c", "import re, sys"], gs.env)
        interleaved(2, contenders)  # fill the byte-code caches, untimed
        samples = interleaved(args.runs, contenders)

    floor_ms = median_ms(samples["python -c pass"])
    rows = [["python -c pass (the floor)", f"{floor_ms:.1f} ms", "1.00x", "", ""]]
    for name, times in samples.items():
        if name == "python -c pass":
            continue
        ms = median_ms(times)
        target = SUBMIT_TARGET_RATIO if name == "submit" else TARGET_RATIO
        shown_target = "" if "typer" in name or name == SCRIPT_OWN else f"<= {target:.1f}x"
        label = name if name == SCRIPT_OWN else f"gpusched {name}"
        rows.append(
            [
                label,
                f"{ms:.1f} ms",
                ratio(ms, floor_ms),
                shown_target,
                verdict(ms / floor_ms, target) if shown_target else "",
            ]
        )
    print_table(
        f"everyday commands, median wall time ({args.runs} runs each, interleaved)",
        ["command", "median", "ratio to floor", "target", "verdict"],
        rows,
    )
    time_daemon_starts(script, max(5, args.runs // 3))


def daemon_start_s(argv: list[str], homes: list[int]) -> float:
    """Seconds from spawning a daemon in a fresh home until it answers `status`."""
    homes.append(len(homes))
    home = scratch_dir() / f"d{homes[-1]}"
    home.mkdir(mode=0o700)
    env = {**base_env(), "GPUSCHED_HOME": str(home), "GPUSCHED_SIMULATE": "4x80GiB"}
    probe = Gpusched.__new__(Gpusched)  # only its socket call: this home has no CLI daemon
    probe.socket = str(home / "run" / "gpusched.sock")
    start = time.perf_counter()
    daemon = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        while True:
            try:
                probe.call("status")
                return time.perf_counter() - start
            except OSError:  # not listening yet
                if daemon.poll() is not None:
                    raise RuntimeError(f"{' '.join(argv)} exited {daemon.returncode}") from None
                time.sleep(0.002)
    finally:
        daemon.kill()
        daemon.wait()
        remove_at_exit(home)


def time_daemon_starts(script: str, runs: int) -> None:
    python = script_python(script)
    homes: list[int] = []
    contenders = {
        "python -m gpusched.daemon": [python, "-m", "gpusched.daemon"],
        "gpusched daemon run --user": [script, "daemon", "run", "--user"],
    }
    samples = interleaved(
        runs,
        {
            name: (lambda argv=argv: daemon_start_s(argv, homes))
            for name, argv in contenders.items()
        },
    )
    peer_ms = median_ms(samples["gpusched daemon run --user"])
    print_table(
        f"a daemon's start, spawn to its first answer, median ({runs} runs each, interleaved)",
        ["started as", "median", "ratio to the typer command"],
        [
            [name, f"{median_ms(times):.0f} ms", ratio(median_ms(times), peer_ms)]
            for name, times in samples.items()
        ],
    )


if __name__ == "__main__":
    main()

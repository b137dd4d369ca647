"""The gpusched(1) man page, generated from the command tree of the CLI.

Each command's usage, help and options come from the same click objects that print
`--help` (the option lines are their help records), so the page cannot say other than
`--help` does; the exit statuses, environment and files are written here once. `gpusched
man` prints the page, man/gpusched.1 is a copy (the wheel installs it in share/man/man1),
and a test regenerates it to catch a stale copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer

from gpusched import __version__
from gpusched.cli.helpformat import placeholder
from gpusched.client.modes import SYSTEM_ROOT_ENV
from gpusched.proc.jobenv import VARIABLES

# (status, meaning): README.md's "Exit codes" says the same at more length.
EXIT_STATUSES = (
    (
        "0",
        "Success; for submit --wait and wait: every job succeeded. gpusched alone, "
        "which prints its help.",
    ),
    ("N", "submit --wait, resubmit --wait, wait: the job exited with status N."),
    (
        "128+S",
        "submit --wait, wait: the job was killed by signal S (143 after a cancel's SIGTERM).",
    ),
    ("127", "submit --wait, wait: the job could not start (or its own command exited 127)."),
    ("130", "submit --wait, wait interrupted with Ctrl-C: the jobs go on."),
    (
        "1",
        "An error: an unknown job id, another user's job, no daemon, a refused change, "
        "standard output closed, a job cancelled or lost without a status; doctor: "
        "something is wrong.",
    ),
    ("2", "A bad command line or value (--gpu-mem 12XB, a negative --gpus, no command)."),
    ("3", "daemon status: no daemon is running."),
)

# (variable, meaning) for the variables gpusched itself reads.
ENVIRONMENT = (
    (
        "GPUSCHED_HOME",
        "Keep the config (DIR/gpusched.toml), queue, logs and socket under "
        "this directory: an isolated instance with its own daemon.",
    ),
    ("GPUSCHED_CONFIG", "The config file to read instead of the default one."),
    ("GPUSCHED_SOCKET", "Talk to the daemon on this socket (never started on demand)."),
    (
        "GPUSCHED_SIMULATE",
        "Simulated GPUs for a daemon started here, e.g. 4x80GiB or 2xH100-80GiB,2xA100-40GiB.",
    ),
    (SYSTEM_ROOT_ENV, "Move the system mode's /etc, /var and /run paths under this directory."),
    (
        "GPUSCHED_NO_FAST_PATH",
        "1: run every command through the full command-line library (for debugging).",
    ),
    ("GPUSCHED_DEBUG", "1: print the traceback of an unexpected error."),
    (
        "XDG_CONFIG_HOME, XDG_STATE_HOME",
        "Where the user mode's config, state and socket live (see FILES).",
    ),
    ("NO_COLOR", "Set: print no colours."),
)

FILES = (
    (
        "$XDG_CONFIG_HOME/gpusched/gpusched.toml",
        "The user daemon's config (default "
        "~/.config/gpusched/gpusched.toml); every key is in gpusched.toml.example.",
    ),
    (
        "$XDG_STATE_HOME/gpusched/",
        "The user daemon's queue (queue.db), job files, logs, "
        "daemon.log and audit.log (default ~/.local/state/gpusched).",
    ),
    (
        "$XDG_STATE_HOME/gpusched/run/gpusched.sock",
        "The user daemon's socket, beside its "
        "queue (whatever XDG_RUNTIME_DIR says, so that cron finds the same daemon).",
    ),
    ("/etc/gpusched/gpusched.toml", "The system daemon's config."),
    ("/var/lib/gpusched/", "The system daemon's queue, job files and audit log."),
    (
        "/run/gpusched/gpusched.sock",
        "The system daemon's socket; where it exists, commands talk to the system daemon.",
    ),
    ("/var/log/gpusched/USER/", "Job logs in system mode (ID.stdout.log, ID.stderr.log)."),
)

SEE_ALSO = "nvidia-smi(1), sbatch(1), squeue(1), systemctl(1)"


def generate(root: Any) -> str:
    """The man page, in roff, for ROOT: the click command that typer builds for the app."""
    ctx = typer.Context(root, info_name="gpusched")
    # .nh .ad l: no hyphens or stretched spaces in the options and paths people copy
    lines = [
        f'.TH GPUSCHED 1 "" "gpusched {__version__}" "User Commands"',
        ".nh",
        ".ad l",
        ".SH NAME",
        r"gpusched \- " + _escape(_summary(root)),
        ".SH SYNOPSIS",
        r"\fBgpusched\fR [\fIOPTIONS\fR] \fICOMMAND\fR [\fIARGS\fR]...",
        ".SH DESCRIPTION",
        *_help_body(root),
        ".SH OPTIONS",
        *_options(root, ctx),
        ".PP",
        _escape(
            "Every command takes -h and --help: its own help (after submit's "
            "--, they are the job's)."
        ),
        ".SH COMMANDS",
    ]
    for command, command_ctx in _commands(root, ctx):
        lines += _command(command, command_ctx)
    lines += _table("EXIT STATUS", EXIT_STATUSES)
    lines += _table("ENVIRONMENT", ENVIRONMENT)
    lines += [".PP", "In a job, gpusched sets:"]
    lines += _entries(sorted(VARIABLES.items()))
    lines += _table("FILES", FILES)
    lines += [".SH SEE ALSO", _escape(SEE_ALSO)]
    return "\n".join(lines) + "\n"


def _commands(group: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """Every visible command, in `--help` order; a group's commands follow the group."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        command_ctx = typer.Context(command, info_name=name, parent=ctx)
        yield command, command_ctx
        if hasattr(command, "list_commands"):
            yield from _commands(command, command_ctx)


def _command(command: Any, ctx: Any) -> list[str]:
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    lines = [".SS " + _quote(usage), *_help_body(command)]  # the command's --help, in roff
    arguments = [
        (placeholder(p), p.help or "")
        for p in command.get_params(ctx)
        if p.param_type_name == "argument" and not p.hidden
    ]
    lines += _entries(arguments)
    return lines + _options(command, ctx)


def _options(command: Any, ctx: Any) -> list[str]:
    """The option lines of `--help`: names, value placeholder, help and default. The help
    option, the same in every command, is listed once, under OPTIONS."""
    records = [
        record
        for p in command.get_params(ctx)
        if p.param_type_name == "option"
        and (p.name != "help" or ctx.parent is None)
        and (record := p.get_help_record(ctx))
    ]
    return _entries(records)


def _entries(pairs: Any) -> list[str]:
    lines = []
    for term, text in pairs:
        lines += [".TP", r"\fB" + _escape(term) + r"\fR", _escape(text)]
    return lines


def _table(title: str, pairs: Any) -> list[str]:
    return [f".SH {title}", *_entries(pairs)]


def _summary(command: Any) -> str:
    return _paragraphs(command)[0][1][0].rstrip(".")


def _paragraphs(command: Any) -> list[tuple[bool, list[str]]]:
    """The help text as (verbatim, lines) paragraphs; click's \\b marks a verbatim one."""
    text = (command.help or "").split("\f")[0]
    paragraphs = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        verbatim = lines[0].strip() == "\b"
        paragraphs.append((verbatim, lines[1:] if verbatim else lines))
    return paragraphs


def _help_body(command: Any) -> list[str]:
    lines: list[str] = []
    for verbatim, paragraph in _paragraphs(command):
        if verbatim:
            lines += [".PP", ".nf", *(_escape(line) for line in paragraph), ".fi"]
        else:
            lines += [".PP", _escape(" ".join(line.strip() for line in paragraph))]
    return lines


def _quote(text: str) -> str:
    return '"' + _escape(text).replace('"', r"\(dq") + '"'


def _escape(text: str) -> str:
    """roff-safe text: backslashes, ASCII hyphens (options copy as typed), and no line that
    starts with a control character."""
    text = text.replace("\\", r"\e").replace("-", r"\-")
    return "\n".join(r"\&" + line if line[:1] in (".", "'") else line for line in text.split("\n"))

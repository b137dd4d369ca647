"""`gpusched submit` and `resubmit`: queue a job, or one again, and print its id.

Their options are declared once, in client/submit/options.py (the submit fast path reads the
same table); the typer signatures here are built from it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Optional, TypeVar

import typer

from gpusched.cli.helpformat import App, Command
from gpusched.client.cmdline import flags_of
from gpusched.client.submit.options import RESUBMIT, RESUBMIT_FIELDS, SUBMIT, SubmitOptions
from gpusched.client.submit.slurmflags import check_command_line
from gpusched.client.submit.submitting import resubmit_and_report, submit_and_report
from gpusched.core.spec.syntax import parse_yes_no

app = App()
_TYPES = {"str": str, "int": int, "list": list[str], "flag": bool, "yesno": bool}
_Command = TypeVar("_Command", bound=Callable[..., Any])
_OPTIONS = flags_of(SUBMIT)


def with_options(rows: tuple[tuple[Any, ...], ...]) -> Callable[[_Command], _Command]:
    """Give a command whose options come as **options the signature typer reads: its own
    parameters, then a keyword parameter per row of an options table, named as the row's
    field (a SubmitOptions field for submit's); a row's sixth item is its metavar."""

    def decorate(command: _Command) -> _Command:
        params = [
            p
            for p in inspect.signature(command, eval_str=True).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        for field, flags, kind, default, help_text, *metavar in rows:
            option = typer.Option(
                list(default) if kind == "list" else default,
                *flags,
                help=help_text,
                metavar=metavar[0] if metavar else None,
            )
            annotation = _TYPES[kind] if default is not None else Optional[_TYPES[kind]]  # noqa: UP045 - typer reads it at run time, on Python 3.10 too
            params.append(
                inspect.Parameter(
                    field, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation
                )
            )
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # a function takes the attribute; Callable cannot say so
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


class SubmitCommand(Command):
    """`submit`, which also reads Slurm's `--kill-on-invalid-dep=yes|no`: typer's flags take
    no value, so that form is folded into the bare flag first. sbatch options gpusched
    refuses, and stray words before `--`, are refused first."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        check_command_line(args, _OPTIONS)
        return super().parse_args(ctx, fold_yes_no(args))


def fold_yes_no(argv: list[str]) -> list[str]:
    """The command line with each yes/no option before the command (`--kill-on-invalid-dep`,
    `--kill-on-invalid-dep=no`) folded into one leading bare flag, or none when the last
    says no: the form typer's flags read. Raises UsageError for a value not yes or no."""
    kept, set_flags, i = [], {}, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break  # the command, which keeps its own arguments
        name, has_inline, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        kind = _OPTIONS.get(name, ("", ""))[1]
        if not kind:
            break  # unknown here (a typo, --help, -WG): typer reads it and the rest
        if kind == "yesno":
            set_flags[name] = parse_yes_no(inline, name) if has_inline else True
        else:
            kept.append(arg)
            if kind != "flag" and not has_inline and i + 1 < len(argv):
                i += 1
                kept.append(argv[i])  # an option's value, even one that looks like an option
        i += 1
    return [name for name, on in set_flags.items() if on] + kept + argv[i:]


@app.command(cls=SubmitCommand, context_settings={"allow_interspersed_args": False})
@with_options(SUBMIT)
def submit(
    command: list[str] | None = typer.Argument(
        None, metavar="-- COMMAND...", help="The command and its arguments."
    ),
    **options: Any,
) -> None:
    """Queue a job and print its id.

    \b
    Examples:
      gpusched submit --gpus 1 --gpu-mem 20G -- python train.py
      gpusched submit --gpus 2 --time 4h --wait -- torchrun train.py
      gpusched submit --gpus 1 --container pytorch:24.01 -- python train.py
    """
    opts = SubmitOptions(command=command or [], **options)
    raise typer.Exit(submit_and_report(opts))


@app.command()
@with_options(RESUBMIT)
def resubmit(
    job_id: str = typer.Argument(
        ...,
        metavar="JOBID",
        help="The job to run again (an array's id: the whole array; ARRAY_INDEX: one element).",
    ),
    **options: Any,
) -> None:
    """Run a job again as a new job, and print its id.

    The new job has the old one's spec: command, working directory, the environment it
    was submitted with, GPUs, memory, limits, constraints, dependencies, retries. The
    options below change that part of it. Any job may be run again, even one still
    pending or running (that one is left as it is); only its owner or an admin may, and
    the new job runs as the old one's user.

    \b
    Examples:
      gpusched resubmit 12
      gpusched resubmit 12 --gpus 2 --time 8h --hold
    """
    # Not given: None, or False for a flag (0 and "" are values someone gave).
    given = [
        name
        for name, value in options.items()
        if name in RESUBMIT_FIELDS and value is not None and value is not False
    ]
    opts = SubmitOptions(**{k: v for k, v in options.items() if v is not None})
    raise typer.Exit(resubmit_and_report(job_id, opts, given))

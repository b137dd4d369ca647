"""How `--help` reads: placeholders that name what to type, `-h` everywhere, help for no command.

typer labels a value with its Python type (`<int>`, `<list[str]>`) and a required
argument with braces (`{job_id}`). Every command of the CLI is built by the classes here,
which name each value instead: from the parameter's own metavar, else from PLACEHOLDERS
by option name, else from the option's name in capitals (as argparse does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import CommandFunctionType

HELP_OPTIONS = ["-h", "--help"]

# What to type after each option that takes a value; one name means one idea in every
# command (`--gpus N` in submit, resubmit and simulate).
PLACEHOLDERS = {
    "--gpus": "N",
    "--gpu-mem": "SIZE|auto",
    "--name": "NAME",
    "--priority": "N",
    "--cwd": "DIR",
    "--env": "NAME=VALUE",
    "--from-file": "FILE",
    "--after": "JOBID[,JOBID]",
    "--dependency": "TYPE:JOBID[:JOBID]",
    "--array": "INDICES[%N]",
    "--time": "DURATION",
    "--signal": "SIG@SECONDS",
    "--retries": "N",
    "--retry-on": "END[,END]",
    "--policy": "POLICY",
    "--gpu-ids": "GPU[,GPU]",
    "--exclude-gpus": "GPU[,GPU]",
    "--gpu-type": "MODEL",
    "--min-gpu-total-mem": "SIZE",
    "--min-compute-capability": "X.Y",
    "--cpus": "N",
    "--mem": "SIZE",
    "--interval": "SECONDS",
    "--query": "FIELDS",
    "--format": "FORMAT",
    "--discipline": "DISCIPLINE",
    "--load": "FRACTION",
    "--arrivals": "trace|poisson",
    "--seed": "N",
    "--dir": "DIR",
    "--user": "USER[,USER]",
    "--state": "STATE[,STATE]",
    "--mem-growth": "FACTOR",
    "--gpu-mem-over": "report|stop|requeue",
    "--container": "IMAGE",
    "--container-opt": "OPT",
    "--retry-delay": "DURATION",
    "--preempt-grace": "DURATION",
    "--open-mode": "truncate|append",
    "--output": "FILE",
    "--error": "FILE",
    "--target-latency": "DURATION",
    "--target-in-flight": "N",
    "--window": "DURATION",
    "--cooldown": "DURATION",
    "--high-priority-share": "FRACTION",
    "--replicas": "N[:MAX]",
    # sbatch's spellings (client/submit/options.py)
    "--gpus-per-node": "N",
    "--ntasks": "N",
    "--nodes": "N",
    "--nice": "N",
    "--gres": "gpu[:TYPE]:N",
    "--export": "ALL|NONE|NAME[=VALUE]",
}


def placeholder(param: Any) -> str:
    """What to type for a parameter: `N`, `SIZE`, `JOBID...`."""
    metavar: str | None = param.metavar
    if metavar:
        return metavar
    if param.param_type_name == "option":
        # Any of its spellings (-J, --name, --job-name): one placeholder for one idea.
        named = next((PLACEHOLDERS[o] for o in param.opts if o in PLACEHOLDERS), None)
        longest: str = max(param.opts, key=len)
        return named or longest.lstrip("-").replace("-", "_").upper()
    name: str = param.name
    return name.upper() + ("..." if param.nargs != 1 else "")


def _name_values(params: list[Any]) -> None:
    for param in params:
        if param.param_type_name == "option" and not param.is_flag and not param.metavar:
            param.metavar = placeholder(param)


def _usage_pieces(command: Any, ctx: Any) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            pieces.append(placeholder(param) if param.required else f"[{placeholder(param)}]")
    return pieces


def _format_parameters(command: Any, ctx: Any, formatter: Any) -> None:
    arguments = [
        (placeholder(p), p.help or "")
        for p in command.get_params(ctx)
        if p.param_type_name == "argument" and not p.hidden
    ]
    options = [
        record
        for p in command.get_params(ctx)
        if p.param_type_name == "option" and (record := p.get_help_record(ctx))
    ]
    if arguments:
        with formatter.section("Arguments"):
            formatter.write_dl(arguments)
    if options:
        with formatter.section("Options"):
            formatter.write_dl(options)


class Command(TyperCommand):
    """A command whose help names its values (`--gpus N`, `JOBID...`)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _name_values(self.params)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _format_parameters(self, ctx, formatter)


class Group(TyperGroup):
    """A group of commands: alone (`gpusched`, `gpusched daemon`) it prints its help to
    standard output and exits 0, since help is what the person asked for."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _name_values(self.params)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help())
            raise typer.Exit(0)
        return super().parse_args(ctx, args)


class App(typer.Typer):
    """typer.Typer whose commands and groups are the classes above, with `-h` for help."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("cls", Group)
        kwargs.setdefault("context_settings", {"help_option_names": HELP_OPTIONS})
        super().__init__(**kwargs)

    def command(
        self, *args: Any, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)

"""`gpusched submit` without importing typer (about 100 ms), for scripts that submit often.

It accepts exactly the options of the typer `submit` command, both built from the table
in options.py; anything it does not recognize (help, a typo, a bad number) returns None
and the full command line parser takes over, so errors and help read the same either
way. tests/test_fastsubmit.py keeps the two parsers in step.
"""

from __future__ import annotations

from gpusched.client.submit.options import SUBMIT, SubmitOptions, flags_of
from gpusched.client.submit.slurmflags import check_command_line
from gpusched.client.submit.submitting import submit_and_report
from gpusched.core.errors import GpuschedError, UsageError, report_error

# option -> (SubmitOptions field, kind), from the one table of submit's options.
OPTIONS = flags_of(SUBMIT)


def _yes_no(text: str, option: str) -> bool:
    from gpusched.core.spec.syntax import parse_yes_no  # noqa: PLC0415 - 0.7 ms of every submit

    return parse_yes_no(text, option)


def parse(argv: list[str]) -> SubmitOptions | None:
    """The options of `submit ARGV`, or None when the full parser should decide. Raises
    UsageError for an sbatch option gpusched refuses, or stray words before `--`."""
    check_command_line(argv, OPTIONS)
    opts = SubmitOptions()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            opts.command = argv[i + 1 :]
            return opts
        if not arg.startswith("-") or arg == "-":
            opts.command = argv[i:]  # the command starts at the first non-option
            return opts
        name, has_inline, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in OPTIONS:
            return None
        field, kind = OPTIONS[name]
        if kind in ("flag", "yesno"):
            if has_inline and kind == "flag":
                return None
            try:
                setattr(opts, field, _yes_no(inline, name) if has_inline else True)
            except UsageError:
                return None
            i += 1
            continue
        if has_inline:
            value, i = inline, i + 1
        elif i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        else:
            return None
        if kind == "int":
            try:
                setattr(opts, field, int(value))
            except ValueError:
                return None
        elif kind == "list":
            getattr(opts, field).append(value)
        else:
            setattr(opts, field, value)
    return opts


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
        kind = OPTIONS.get(name, ("", ""))[1]
        if not kind:
            break  # unknown here (a typo, --help, -WG): typer reads it and the rest
        if kind == "yesno":
            set_flags[name] = _yes_no(inline, name) if has_inline else True
        else:
            kept.append(arg)
            if kind != "flag" and not has_inline and i + 1 < len(argv):
                i += 1
                kept.append(argv[i])  # an option's value, even one that looks like an option
        i += 1
    return [name for name, on in set_flags.items() if on] + kept + argv[i:]


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

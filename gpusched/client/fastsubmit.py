"""`gpusched submit` without importing typer (about 100 ms), for scripts that submit often.

It accepts exactly the options of the typer `submit` command; anything it does not
recognize (help, a typo, a bad number) returns None and the full command line parser
takes over, so errors and help read the same either way. tests/test_fastsubmit.py keeps
the two parsers in step.
"""

from __future__ import annotations

from gpusched.core.errors import GpuschedError, UsageError, report_error
from gpusched.client.submitting import SubmitOptions, submit_and_report
from gpusched.core.syntax import parse_yes_no

# option -> (SubmitOptions field, kind): "int" and "str" take a value, "list" repeats,
# "flag" takes none, "yesno" is a flag that also takes Slurm's =yes or =no.
OPTIONS = {
    "--gpus": ("gpus", "str"), "-G": ("gpus", "str"),
    "--gpu-mem": ("gpu_mem", "str"),
    "--name": ("name", "str"), "--job-name": ("name", "str"), "-n": ("name", "str"),
    "--priority": ("priority", "int"),
    "--cwd": ("cwd", "str"), "--chdir": ("cwd", "str"),
    "--env": ("env", "list"), "-e": ("env", "list"),
    "--from-file": ("from_file", "str"), "-f": ("from_file", "str"),
    "--wait": ("wait", "flag"), "-W": ("wait", "flag"),
    "--json": ("json", "flag"),
    "--hold": ("hold", "flag"),
    "--after": ("after", "list"),
    "--dependency": ("dependency", "list"), "-d": ("dependency", "list"),
    "--kill-on-invalid-dep": ("kill_on_invalid_dep", "yesno"),
    "--array": ("array", "str"), "-a": ("array", "str"),
    "--time": ("time", "str"), "-t": ("time", "str"),
    "--signal": ("signal", "str"),
    "--retries": ("retries", "int"),
    "--retry-on": ("retry_on", "str"),
    "--retry-delay": ("retry_delay", "str"),
    "--policy": ("policy", "str"),
    "--gpu-ids": ("gpu_ids", "str"),
    "--exclude-gpus": ("exclude_gpus", "str"),
    "--gpu-type": ("gpu_type", "str"),
    "--min-gpu-total-mem": ("min_gpu_total_mem", "str"),
    "--min-compute-capability": ("min_compute_capability", "str"),
    "--cpus": ("cpus", "int"), "--cpus-per-task": ("cpus", "int"), "-c": ("cpus", "int"),
    "--mem": ("mem", "str"),
}


def parse(argv: list[str]) -> SubmitOptions | None:
    """The options of `submit ARGV`, or None when the full parser should decide."""
    opts = SubmitOptions()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            opts.command = argv[i + 1:]
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
                setattr(opts, field, parse_yes_no(inline, name) if has_inline else True)
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
            set_flags[name] = parse_yes_no(inline, name) if has_inline else True
        else:
            kept.append(arg)
            if kind != "flag" and not has_inline and i + 1 < len(argv):
                i += 1
                kept.append(argv[i])  # an option's value, even one that looks like an option
        i += 1
    return [name for name, on in set_flags.items() if on] + kept + argv[i:]


def try_fast_submit(argv: list[str]) -> int | None:
    opts = parse(argv)
    if opts is None:
        return None
    try:
        return submit_and_report(opts)
    except GpuschedError as exc:
        return report_error(exc)
    except KeyboardInterrupt:
        return 130

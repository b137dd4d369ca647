"""The `gpusched` command line: thin typer commands that parse, make one call, and render."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from gpusched import __version__
from gpusched.cli import gpuquery, render
from gpusched.core import syntax
from gpusched.cli.helpformat import App, Command
from gpusched.client.connection import Client, start_daemon, wait_for_exit
from gpusched.core.errors import (DaemonUnavailable, GpuschedError, UsageError, detach_stdout,
                             is_stdout_gone, report_error)
from gpusched.client.submitting import (SubmitOptions, ended_status, print_json, submit_and_report,
                                 wait_or_explain)

app = App(add_completion=False, no_args_is_help=True, rich_markup_mode=None)
daemon_app = App(no_args_is_help=True, help="Start, stop and inspect the daemon.\n\n"
                 "Example: gpusched daemon status")
app.add_typer(daemon_app, name="daemon")

# Piped into grep or a file, a listing keeps each job on one line instead of folding
# cells to 80 columns.
out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 1000)
JSON_HELP = "Print JSON (stable field names) instead of a table."


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpusched {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Schedule jobs on the GPUs of a shared machine.

    `gpusched COMMAND -h` tells more about each command.

    \b
    Examples:
      gpusched submit --gpus 1 --gpu-mem 20G -- python train.py
      gpusched ls
    """


class SubmitCommand(Command):
    """`submit`, which also reads Slurm's `--kill-on-invalid-dep=yes|no`: typer's flags take
    no value, so the fast path's parser folds that form into the bare flag first."""

    def parse_args(self, ctx, args):  # noqa: ANN001 - click's signature
        from gpusched.client.fastsubmit import fold_yes_no

        return super().parse_args(ctx, fold_yes_no(args))


@app.command(cls=SubmitCommand, context_settings={"allow_interspersed_args": False})
def submit(
    command: Optional[List[str]] = typer.Argument(None, metavar="-- COMMAND...",
                                                  help="The command and its arguments."),
    gpus: Optional[str] = typer.Option(None, "--gpus", "-G",
                                       help="GPUs to give the job: N, or TYPE:N as in Slurm "
                                       "(a100:2: two whose name contains a100). Default 0; "
                                       "1 with --gpu-mem, --gpu-ids or another GPU constraint."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", help="Memory per GPU, e.g. 20G. "
                                          "Jobs may then share a GPU; without it GPUs are whole."),
    name: str = typer.Option("", "--name", "--job-name", "-n", help="A name to show in listings."),
    priority: int = typer.Option(0, "--priority", help="Higher starts first."),
    cwd: Optional[str] = typer.Option(None, "--cwd", "--chdir",
                                      help="Working directory (default: here)."),
    env: List[str] = typer.Option([], "--env", "-e", help="Set NAME=VALUE for the job."),
    from_file: Optional[str] = typer.Option(None, "--from-file", "-f",
                                            help="One job per line of shell commands (- for stdin)."),
    wait: bool = typer.Option(False, "--wait", "-W", help="Wait, then exit with the job's status."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    hold: bool = typer.Option(False, "--hold", help="Queue it held: it starts after `release`."),
    after: List[str] = typer.Option([], "--after", help="Start after these jobs succeed: 3,4."),
    dependency: List[str] = typer.Option([], "--dependency", "-d",
                                         help="Slurm form: afterok:3:4,afterany:5,afternotok:6, "
                                         "after:7 (once 7 started); ids may be ARRAY_INDEX (12_3)."),
    kill_on_invalid_dep: bool = typer.Option(False, "--kill-on-invalid-dep",
                                             help="Cancel the job if its dependency can never be "
                                             "met (also Slurm's =yes or =no)."),
    array: Optional[str] = typer.Option(None, "--array", "-a",
                                        help="One job per index: 0-99, 1,3,5-7, 0-15:4 (a step); 0-99%8 runs at most 8 at once."),
    time_limit: Optional[str] = typer.Option(None, "--time", "-t",
                                             help="Time limit as in Slurm: MINUTES (a bare number "
                                             "is minutes), M:S, H:M:S, D-H, D-H:M, D-H:M:S; or "
                                             "45s, 2h30m, 1d; 0 or UNLIMITED for none."),
    warn: Optional[str] = typer.Option(None, "--signal",
                                       help="[B:]SIG[@SECONDS] before the time limit, e.g. "
                                       "USR1@120 (default 60 s)."),
    retries: int = typer.Option(0, "--retries", help="Re-queue a failed job up to N times."),
    retry_on: Optional[str] = typer.Option(None, "--retry-on",
                                           help="Ends that re-queue: failed,timeout,cancelled,lost."),
    retry_delay: Optional[str] = typer.Option(
        None, "--retry-delay", help="Wait before a retry (default 10s), doubling after each "
        "failed attempt up to 5m (or the delay, if longer); 0 retries at once."),
    policy: Optional[str] = typer.Option(None, "--policy", help="Placement policy for this job."),
    gpu_ids: Optional[str] = typer.Option(None, "--gpu-ids", help="Only these GPUs: 0,2 "
                                          "(one of them, unless --gpus asks for more)."),
    exclude_gpus: Optional[str] = typer.Option(None, "--exclude-gpus", help="Never these GPUs: 3."),
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="Part of the GPU name: H100."),
    min_gpu_total_mem: Optional[str] = typer.Option(None, "--min-gpu-total-mem",
                                                    help="Only GPUs with this much memory: 40G."),
    min_compute_capability: Optional[str] = typer.Option(None, "--min-compute-capability",
                                                         help="Only GPUs at least this: 8.0."),
    cpus: Optional[int] = typer.Option(
        None, "--cpus", "--cpus-per-task", "-c", help="CPU cores the job needs; it waits for "
        "them. Without it a GPU job counts one core but never waits for it; 0 needs none."),
    mem: Optional[str] = typer.Option(None, "--mem", help="Host memory the job needs, e.g. 16G "
                                      "(a bare number is MiB, as in Slurm)."),
) -> None:
    """Queue a job and print its id.

    \b
    Examples:
      gpusched submit --gpus 1 --gpu-mem 20G -- python train.py
      gpusched submit --gpus 2 --time 4h --wait -- torchrun train.py
    """
    opts = SubmitOptions(
        command=command or [], gpus=gpus, gpu_mem=gpu_mem, name=name, priority=priority, cwd=cwd,
        env=env, from_file=from_file, wait=wait, json=as_json, hold=hold, after=after,
        dependency=dependency, kill_on_invalid_dep=kill_on_invalid_dep, array=array,
        time=time_limit, signal=warn, retries=retries, retry_on=retry_on,
        retry_delay=retry_delay, policy=policy,
        gpu_ids=gpu_ids, exclude_gpus=exclude_gpus, gpu_type=gpu_type,
        min_gpu_total_mem=min_gpu_total_mem, min_compute_capability=min_compute_capability,
        cpus=cpus, mem=mem)
    raise typer.Exit(submit_and_report(opts))


@app.command()
def resubmit(
    job_id: str = typer.Argument(..., metavar="JOBID", help="The job to run again (an "
                                 "array's id: the whole array; ARRAY_INDEX: one element)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-G", help="GPUs instead of the job's "
                                       "(0 also drops its --gpu-mem and GPU constraints)."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", help="Memory per GPU instead of "
                                          "the job's."),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="Another name."),
    priority: Optional[int] = typer.Option(None, "--priority", help="Another priority."),
    time_limit: Optional[str] = typer.Option(None, "--time", "-t", help="Another time limit."),
    cpus: Optional[int] = typer.Option(None, "--cpus", "-c", help="Other CPU cores."),
    mem: Optional[str] = typer.Option(None, "--mem", help="Other host memory."),
    hold: bool = typer.Option(False, "--hold", help="Queue it held: it starts after `release`."),
    wait: bool = typer.Option(False, "--wait", "-W", help="Wait, then exit with the job's status."),
    as_json: bool = typer.Option(False, "--json", help="Print the new id as JSON."),
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
    from gpusched.client.submitting import resubmit_and_report

    values = {"gpus": gpus, "gpu_mem": gpu_mem, "name": name, "priority": priority,
              "time": time_limit, "cpus": cpus, "mem": mem, "hold": hold or None}
    given = [option for option, value in values.items() if value is not None]
    opts = SubmitOptions(**{k: v for k, v in values.items() if v is not None}, wait=wait,
                         json=as_json)
    raise typer.Exit(resubmit_and_report(job_id, opts, given))


@app.command("ls")
def list_jobs(
    all_jobs: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    expand: bool = typer.Option(False, "--expand", "-r", help="One line per array element."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    users: Optional[str] = typer.Option(None, "--user", "-u", help="Only these users' jobs."),
    me: bool = typer.Option(False, "--me", help="Only your own jobs."),
    states: Optional[str] = typer.Option(None, "--state", "-t", help="Only jobs in these "
                                         "states; a finished state implies --all."),
    names: Optional[str] = typer.Option(None, "--name", "-n", metavar="NAME[,NAME]",
                                        help="Only jobs of these names; wildcards like 'sweep-*'."),
    fields: Optional[str] = typer.Option(None, "--format", "-O", metavar="FIELDS",
                                         help="Plain columns for scripts, one line per job: "
                                         "jobid,user,state,reason,... (README lists the fields)."),
    noheader: bool = typer.Option(False, "--noheader", help="With --format: no header line."),
) -> None:
    """List pending and running jobs (finished ones too with --all).

    Arrays fold into one line. States: pending, running, succeeded, failed, cancelled,
    timeout, oom, lost (Slurm's PD, R, CD, F, CA, TO, OOM, NF too).

    \b
    Examples:
      gpusched ls --me --state running
      gpusched ls --all --name 'sweep-*' --format jobid,state,exitcode --noheader
    """
    from gpusched.cli import listing

    if as_json and fields is not None:
        raise UsageError("choose one of --json and --format")
    columns = listing.parse_fields(fields) if fields is not None else None
    filters = listing.request_filters(users, me, states, names)
    jobs = Client().call("list", all=all_jobs, **filters)["jobs"]
    if as_json:
        print_json(jobs)
    elif columns is not None:
        sys.stdout.write(listing.format_rows(jobs, columns, header=not noheader))
    elif jobs:
        out.print(render.jobs_table(jobs if expand else render.fold_arrays(jobs), out.width))
    elif filters:
        out.print("no jobs match" + ("" if all_jobs or "states" in filters else
                                     " (--all looks at finished ones too)"))
    else:
        out.print("no jobs" if all_jobs else "no pending or running jobs (--all shows finished ones)")


JOB_ID_HELP = "Job id, or ARRAY_INDEX (12_3) for one element of an array."


@app.command()
def show(
    job_id: str = typer.Argument(..., metavar="JOBID", help=JOB_ID_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Everything about one job.

    Example: gpusched show 12
    """
    from gpusched.cli.show import job_lines

    job = Client().call("show", ids=[syntax.job_id_text(job_id)])["jobs"][0]
    if as_json:
        print_json(job)
    else:
        sys.stdout.write("".join(line + "\n" for line in job_lines(job)))


JOB_IDS_HELP = "Job ids; an array's id means all its elements, ARRAY_INDEX (12_3) one."
JOB_IDS = "JOBID..."


def _change(command: str, job_ids: List[str], **args: object) -> None:
    """Print what happened to each job; a job that could not be changed is an error line
    on stderr and makes the exit status 1, the others are changed all the same."""
    ids = [syntax.job_id_text(i) for i in job_ids]  # a bad id is refused before any change
    reply = Client().call(command, ids=ids, **args)
    for job_id, outcome in reply["results"].items():
        out.print(f"job {job_id}: {outcome}", markup=False)
    refused = reply.get("refused") or {}
    for job_id, why in refused.items():
        sys.stderr.write(f"Error: job {job_id}: {why}\n")
    if refused:
        raise typer.Exit(1)


@app.command()
def cancel(job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Cancel jobs: pending ones never start, running ones stop.

    A running job gets SIGTERM, then SIGKILL after the daemon's cancel_grace.

    Example: gpusched cancel 12 13_4
    """
    _change("cancel", job_ids)


@app.command()
def hold(job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Keep pending jobs from starting until `release`.

    Example: gpusched hold 12
    """
    _change("hold", job_ids)


@app.command()
def release(job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Let held jobs start.

    Example: gpusched release 12
    """
    _change("release", job_ids)


@app.command()
def update(
    job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP),
    priority: Optional[int] = typer.Option(None, "--priority", help="The new priority."),
) -> None:
    """Change queued jobs.

    Example: gpusched update 12 --priority 10
    """
    _change("update", job_ids, priority=priority)


@app.command()
def drain() -> None:
    """Start nothing new; running jobs finish. `gpusched resume` undoes it.

    Example: gpusched drain
    """
    result = Client().call("drain")
    out.print(f"draining: nothing new starts; {result['running']} job(s) still running")


@app.command()
def resume() -> None:
    """Start jobs again after `drain`.

    Example: gpusched resume
    """
    Client().call("resume")
    out.print("resumed: jobs start again")


@app.command()
def wait(job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Wait for jobs to end; exit with the first failure's status.

    An array's id waits for all its elements. The exit status is the first non-zero
    status among the jobs, 0 if all succeeded.

    Example: gpusched wait 12 13; echo $?
    """
    jobs = wait_or_explain(Client(), [syntax.job_id_text(i) for i in job_ids])
    raise typer.Exit(ended_status(jobs))


@app.command()
def logs(
    job_id: str = typer.Argument(..., metavar="JOBID", help=JOB_ID_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
    stderr: bool = typer.Option(False, "--stderr", help="Show standard error instead of output."),
) -> None:
    """Print a job's output.

    Example: gpusched logs -f 12
    """
    from gpusched.client.logs import print_log

    print_log(Client(), syntax.job_id_text(job_id), stderr=stderr, follow=follow)


@app.command("env")
def job_env(
    job_id: str = typer.Argument(..., metavar="JOBID", help=JOB_ID_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """The environment a job was submitted with.

    The variables gpusched sets for the job itself are added when it starts.

    Example: gpusched env 12
    """
    env = Client().call("env", id=syntax.job_id_text(job_id))["env"]
    if as_json:
        print_json(env)
    else:
        sys.stdout.write("".join(f"{k}={v}\n" for k, v in sorted(env.items())))


@app.command()
def gpus(
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    query: Optional[str] = typer.Option(None, "--query", help="Fields as nvidia-smi "
                                        "--query-gpu names them: index,name,memory.used,..."),
    fmt: Optional[str] = typer.Option(None, "--format", help="csv[,noheader][,nounits] (the "
                                      "default with --query) or json; without --query, the "
                                      f"fields {gpuquery.DEFAULT_QUERY.replace(',', ', ')}."),
) -> None:
    """The GPUs: memory used and reserved, utilization, jobs.

    \b
    Examples:
      gpusched gpus
      gpusched gpus --query index,memory.used --format csv,noheader
    """
    if query is None and fmt is not None:
        query = gpuquery.DEFAULT_QUERY
    fields = gpuquery.parse_query(query) if query is not None else None
    result = Client().call("gpus")
    if fields is not None:
        sys.stdout.write(gpuquery.render(result["gpus"], fields, fmt or "csv"))
        return
    if as_json:
        print_json(result)
        return
    if result["problem"]:
        out.print(f"No GPUs: {render.safe(result['problem'])}")
    if result["gpus"]:
        out.print(render.gpus_table(result))
    out.print(render.host_line(result["host"]), markup=False)
    procs = render.processes_table(result)
    if procs is not None:
        out.print()
        out.print(procs)


@app.command()
def top(
    interval: float = typer.Option(1.0, "--interval", "-i", help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
) -> None:
    """A live view of GPUs, processes and the queue.

    Keys: q quits, p pauses, u shows only your jobs, s changes the sort, ? helps.

    Example: gpusched top --once
    """
    from gpusched.gpus import open_backend
    from gpusched.tui.app import run_top

    raise typer.Exit(run_top(interval=interval, once=once, open_backend=open_backend))


@app.command()
def simulate(
    trace: Path = typer.Argument(..., metavar="TRACE.csv",
                                 help="A job trace CSV (docs/scheduling.md has the format)."),
    gpus: int = typer.Option(8, "--gpus", help="GPUs of the simulated box."),
    policy: str = typer.Option("pack", "--policy", help="Placement policy."),
    discipline: str = typer.Option("fifo", "--discipline", help="fifo, backfill, fairshare or sjf."),
    load: Optional[float] = typer.Option(None, "--load", help="Scale arrivals to this load (0-1)."),
    arrivals: str = typer.Option("trace", "--arrivals", help="trace (original spacing) or poisson."),
    seed: int = typer.Option(0, "--seed", help="Random seed for --arrivals poisson."),
    cpus: Optional[int] = typer.Option(None, "--cpus", help="Cores of the simulated host "
                                       "(count the trace's cpus column)."),
    mem: Optional[str] = typer.Option(None, "--mem", help="Memory of the simulated host "
                                      "(count the trace's mem_bytes column)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Replay a job trace in simulated time.

    The trace goes through the very placement and queue code the daemon uses.

    Example: gpusched simulate trace.csv --gpus 8 --discipline backfill
    """
    from gpusched.sim.simulator import simulate_command

    raise typer.Exit(simulate_command(trace, gpus=gpus, policy=policy, discipline=discipline,
                                      load=load, arrivals=arrivals, seed=seed, as_json=as_json,
                                      cpus=cpus, mem=mem))


@app.command()
def demo() -> None:
    """Try gpusched on 4 simulated GPUs; cleans up after itself.

    The demo runs its own daemon in a temporary home, never yours.

    Example: gpusched demo
    """
    from gpusched.cli.demo import run_demo

    raise typer.Exit(run_demo(out))


@app.command()
def completions(shell: str = typer.Argument(..., metavar="SHELL", help="bash, zsh or fish.")) -> None:
    """Print the completion script for a shell.

    The README says where to put it for each shell.

    Example: gpusched completions zsh > ~/.zfunc/_gpusched
    """
    from gpusched.cli.completions import SHELLS, generate

    if shell not in SHELLS:
        raise UsageError(f"no completions for {shell!r}; choose one of: {', '.join(SHELLS)}")
    sys.stdout.write(generate(shell, typer.main.get_command(app)))


@app.command("_job-ids", hidden=True)
def job_ids_for_completion(scope: str = typer.Argument("all", metavar="active|all")) -> None:
    """Job ids for shell completion (the console script answers it without typer).

    Example: gpusched _job-ids active
    """
    from gpusched.client.jobids import print_job_ids

    raise typer.Exit(print_job_ids([scope]))


@daemon_app.command("run")
def daemon_run(
    system: bool = typer.Option(False, "--system",
                                help="One daemon for all users (as root): docs/shared-server.md."),
    user: bool = typer.Option(False, "--user", hidden=True,
                              help="This user's daemon even if the system config says system."),
) -> None:
    """Run the daemon in the foreground (for systemd).

    Example: gpusched daemon run --system
    """
    from gpusched.daemon.loop import serve
    from gpusched.client.modes import daemon_paths

    if system and user:
        raise UsageError("choose one of --system and --user")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    serve(daemon_paths(system, user))


@daemon_app.command("start")
def daemon_start() -> None:
    """Start the daemon in the background.

    Any command starts it when none runs; this does only that.

    Example: GPUSCHED_SIMULATE=4x80GiB gpusched daemon start
    """
    client = Client()
    if client.is_running():
        status = client.call("status")
        out.print(f"gpusched daemon already running (pid {status['pid']})")
        return
    if client.paths.mode != "user":
        raise DaemonUnavailable(client.not_running_message())
    out.print(f"gpusched daemon started (pid {_start_daemon(client)})")


@daemon_app.command("stop")
def daemon_stop() -> None:
    """Stop the daemon; running jobs keep running.

    The next daemon re-adopts them.

    Example: gpusched daemon stop
    """
    left = _stop_daemon(Client(autostart=False, check_daemon=False))
    if left is None:
        out.print("gpusched daemon is not running")
    else:
        out.print(f"gpusched daemon stopped; {left} running job(s) left running")


@daemon_app.command("restart")
def daemon_restart() -> None:
    """Restart the daemon with this environment and config file.

    The new daemon reads GPUSCHED_SIMULATE and the config as they are now; running jobs
    keep running and the new daemon re-adopts them.

    Example: gpusched daemon restart
    """
    client = Client(autostart=False, check_daemon=False)
    if client.paths.is_system:
        raise GpuschedError("the system daemon is systemd's to restart: run `sudo systemctl "
                            "restart gpusched` (running jobs keep running)")
    if client.paths.mode != "user":
        raise GpuschedError(f"gpusched does not start the daemon at GPUSCHED_SOCKET="
                            f"{client.paths.socket}; restart it where it was started")
    left = _stop_daemon(client)
    pid = _start_daemon(client)
    if left is None:
        out.print(f"gpusched daemon started (pid {pid}); none was running")
    else:
        out.print(f"gpusched daemon restarted (pid {pid}); {left} running job(s) kept running")


def _start_daemon(client: Client) -> int:
    """Start the user daemon and wait until it answers; its pid."""
    client.wait_until_up(daemon=start_daemon(client.paths)).close()
    return client.call("status")["pid"]


def _stop_daemon(client: Client) -> int | None:
    """Stop the running daemon and wait for it to exit: how many running jobs it left
    running, or None when none was running."""
    if not client.is_running():
        return None
    pid = client.call("status")["pid"]
    result = client.call("stop")
    if not wait_for_exit(pid, 30.0):
        raise GpuschedError(f"the daemon (pid {pid}) did not stop within 30 s")
    return result["running_jobs_left"]


@daemon_app.command("status")
def daemon_status(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Whether the daemon runs, and what it sees.

    Exit status 3 when it does not run.

    Example: gpusched daemon status --json
    """
    client = Client(autostart=False)
    which = client.paths.mode  # user, system, or socket (GPUSCHED_SOCKET)
    if not client.is_running():
        if as_json:
            print_json({"running": False, "daemon": which, "socket": str(client.paths.socket)})
        else:
            out.print(f"gpusched daemon is not running ({which} daemon, socket "
                      f"{client.paths.socket})")
        raise typer.Exit(3)
    status = client.call("status")
    if as_json:
        # The daemon's "running" is its count of running jobs; here "running" says whether
        # the daemon runs, as in the not-running case, and the counts get their own names.
        print_json({**status, "running": True, "running_jobs": status["running"],
                    "pending_jobs": status["pending"], "daemon": which})
    else:
        out.print(f"using the {which} daemon at {client.paths.socket}", markup=False)
        out.print("\n".join(render.status_lines(status)), markup=False)


@daemon_app.command("install-service")
def daemon_install_service(
    system: bool = typer.Option(False, "--system", help="The root daemon for all users."),
    user: bool = typer.Option(False, "--user", help="Your own daemon, under systemd --user."),
    directory: Optional[Path] = typer.Option(None, "--dir",
                                             help="Write the unit here instead of systemd's directory."),
) -> None:
    """Write the systemd unit and print how to enable it.

    Example: sudo gpusched daemon install-service --system
    """
    from gpusched.cli.service import install, next_commands

    if system == user:
        raise UsageError("choose one of --system and --user")
    path = install(system, directory)
    out.print(f"wrote {path}; now run:", markup=False)
    for command in next_commands(system):
        out.print(f"  {command}", markup=False)


JOB_ID_COMMANDS = ("show", "logs", "env", "wait", "cancel", "hold", "release", "update")


def _is_negative_number(option: object) -> bool:
    return isinstance(option, str) and option[:1] == "-" and option[1:2].isdigit()


def main(argv: list[str] | None = None) -> int:
    """Run a command; errors become one line on stderr and an exit status, never a traceback.

    When standard output is closed or its reader has left (`gpusched ls | head -1`), the
    command stops there with status 1 and says nothing more (submit names the jobs it
    queued, see submitting.py): the same for every command.
    """
    status = _run(sys.argv[1:] if argv is None else list(argv))
    try:
        sys.stdout.flush()  # output still buffered for a pipe: its failure is ours to report
    except (OSError, ValueError):
        detach_stdout()
        return status or 1
    return status


def _run(args: list[str]) -> int:
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="gpusched", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except GpuschedError as exc:
        return report_error(exc)
    except typer.TyperException as exc:  # click's usage errors: one line, status 2
        message = exc.format_message().replace("\n", " ")
        first = next((a for a in args if not a.startswith("-")), "")
        if first in JOB_ID_COMMANDS and _is_negative_number(getattr(exc, "option_name", None)):
            # `cancel -1`: to the parser a negative number is an unknown option; say
            # instead what a job id is.
            message = f"{exc.option_name!r} is not a job id; give {syntax.JOB_ID_FORMS}"
        topic = f"{first} " if first in getattr(command, "commands", {}) else ""
        sys.stderr.write(f"Error: {message} (see `gpusched {topic}--help`)\n")
        return getattr(exc, "exit_code", 2)
    except typer.Abort:
        sys.stderr.write("Aborted.\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug: one line for the user, details on request
        if is_stdout_gone(exc):
            detach_stdout()
            return 1
        if os.environ.get("GPUSCHED_DEBUG"):
            raise
        sys.stderr.write(f"Error: internal error: {type(exc).__name__}: {exc}. Rerun with "
                         "GPUSCHED_DEBUG=1 for details and report it.\n")
        return 1

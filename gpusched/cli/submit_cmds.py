"""`gpusched submit` and `resubmit`: queue a job, or one again, and print its id."""

from __future__ import annotations

from typing import List, Optional

import typer

from gpusched.cli.common import JSON_HELP
from gpusched.cli.helpformat import App, Command
from gpusched.client.submitting import SubmitOptions, submit_and_report

app = App()


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


"""A gpusched job as a Slurm batch job: what cannot be handed over (refused before anything
is queued), the sbatch command line, and the wrapper script that runs the command (pure)."""

from __future__ import annotations

import math
import os
import shlex

from gpusched.core.errors import GpuschedError
from gpusched.core.models import Constraints, Job
from gpusched.core.slurm.clusterconf import ClusterConfig
from gpusched.core.spec.begintime import begin_text
from gpusched.core.spec.syntax import signal_name
from gpusched.core.spec.values import without_controls
from gpusched.core.units import size_human

# Slurm dependency kinds for gpusched's (same words).
_DEPENDENCY_KINDS = {
    "afterok": "afterok",
    "afternotok": "afternotok",
    "afterany": "afterany",
    "after": "after",
}
# The signals the wrapper passes on to the command (SIGTERM: scancel and the time limit).
FORWARDED = ("TERM", "INT", "HUP", "USR1", "USR2")
# The marker every Slurm job of gpusched carries: how a restarted daemon finds a job it
# handed over just before it died, and never hands it over twice.
MARKER_PREFIX = "gpusched"


def marker(uuid: str, job_id: int, attempt: int) -> str:
    return f"{MARKER_PREFIX}:{uuid}:{job_id}:{attempt}"


def refusal(job: Job, cluster: ClusterConfig) -> str:
    """Why this job cannot go to the cluster as asked ("" when it can): every option maps
    to Slurm or is refused here, before anything is queued."""
    request, constraints = job.request, job.request.constraints
    if cluster.shared_roots and not any(_under(job.cwd, root) for root in cluster.shared_roots):
        return (
            f"the working directory {job.cwd} is not under the directories the compute "
            f"nodes of cluster {cluster.name} see ({', '.join(cluster.shared_roots)}); "
            "submit from one of them or give --cwd"
        )
    if constraints.gpu_ids or constraints.exclude_gpus:
        return (
            "--gpu-ids and --exclude-gpus name GPUs of this machine; a cluster job "
            "cannot ask for particular GPUs (use --gpu-type or --gpu-mem)"
        )
    if constraints.min_compute_capability is not None:
        return "--min-compute-capability has no Slurm equivalent; use --gpu-type"
    if job.policy:
        return "--policy chooses GPUs on this machine; Slurm places cluster jobs"
    if job.priority > 0:
        return (
            "--priority above 0 would be a negative Slurm --nice, which only Slurm "
            "administrators may set; give 0 or less"
        )
    if job.pty:
        return (
            "--pty runs the job on a terminal of this machine that `gpusched attach` "
            "connects to; a cluster job has none (`srun --pty` on the cluster); leave it out"
        )
    if job.open_mode:
        return (
            "--output and --error are not handed to a cluster yet: its jobs' logs are "
            "on the shared directory, read with `gpusched logs ID`; leave them out"
        )
    if gpu_choice(job, cluster)[0] is None:
        mem = max(request.gpu_mem_bytes or 0, constraints.min_gpu_total_mem_bytes)
        table = (
            ", ".join(
                f"{name} = {size_human(mem_bytes)}"
                for name, mem_bytes in cluster.gpu_types + cluster.gpu_features
            )
            or "empty"
        )
        return (
            f"no GPU of cluster {cluster.name} has {size_human(mem)} (its gpu_types and "
            f"gpu_features: {table}); Slurm's --mem-per-gpu is host memory, so gpusched "
            "asks for a GPU type instead: add one to the config or lower --gpu-mem"
        )
    return ""


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


def gpu_choice(job: Job, cluster: ClusterConfig) -> tuple[tuple[str, str] | None, str]:
    """((how, name), "") for the GPUs' type: ("", "") none wanted, ("type", NAME) a
    --gres type, ("feature", NAME) a --constraint; (None, "") when no entry is enough."""
    constraints: Constraints = job.request.constraints
    mem = max(job.request.gpu_mem_bytes or 0, constraints.min_gpu_total_mem_bytes)
    if constraints.gpu_type:
        return ("type", constraints.gpu_type), ""
    if not mem:
        return ("", ""), ""
    # The smallest GPU that is enough: the big ones stay free for jobs that need them.
    for how, table in (("type", cluster.gpu_types), ("feature", cluster.gpu_features)):
        for name, mem_bytes in table:
            if mem_bytes >= mem:
                return (how, name), ""
    return None, ""


def dependency_arg(deps: list[tuple[str, str]]) -> str:
    """--dependency from (gpusched kind, Slurm id) pairs: all must hold (`,`)."""
    return ",".join(f"{_DEPENDENCY_KINDS[kind]}:{slurm_id}" for kind, slurm_id in deps)


def _slurm_name(job: Job) -> str:
    """--name, else the program's file name, which may hold a newline: made one line."""
    return without_controls(job.display_name) or "gpusched"


def sbatch_argv(
    jobs: list[Job],
    cluster: ClusterConfig,
    script: str,
    output: str,
    error: str,
    mark: str,
    deps: list[tuple[str, str]],
) -> list[str]:
    """The sbatch command line for one job, or for the elements of one array together
    (jobs in index order). Every option comes from the job: nothing from SBATCH_*."""
    job = jobs[0]
    request = job.request
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={_slurm_name(job)}",
        f"--comment={mark}",
        f"--output={output}",
        f"--error={error}",
        "--open-mode=append",
        "--kill-on-invalid-dep=yes",
        "--no-requeue",
        "--export=NONE",
        f"--chdir={os.path.dirname(script)}",
    ]
    for option, value in (
        ("partition", cluster.partition),
        ("account", cluster.account),
        ("qos", cluster.qos),
    ):
        if value:
            argv.append(f"--{option}={value}")
    if request.gpus:
        choice, _ = gpu_choice(job, cluster)
        # None was refused at submit (unsupported() names it): never a queued job's.
        assert choice is not None, f"job {job.id}: no GPU of cluster {cluster.name} is enough"
        how, name = choice
        argv.append(
            f"--gres=gpu:{name}:{request.gpus}"
            if how == "type" and name
            else f"--gres=gpu:{request.gpus}"
        )
        if how == "feature":
            argv.append(f"--constraint={name}")
    if request.cpus_required and request.cpus:
        argv.append(f"--cpus-per-task={request.cpus}")
    mem_bytes = request.mem_bytes or cluster.default_mem_bytes
    if mem_bytes:
        argv.append(f"--mem={math.ceil(mem_bytes / 2**20)}M")
    if job.time_limit_s is not None:
        argv.append(f"--time={math.ceil(job.time_limit_s / 60)}")  # Slurm counts minutes
    if job.warn_signal is not None and job.time_limit_s is not None:
        # B: to the batch shell, the wrapper, which passes it on: without B: the command
        # gets nothing (docs/slurm-compat.md, "time limit and signal").
        argv.append(
            f"--signal=B:{signal_name(job.warn_signal).removeprefix('SIG')}"
            f"@{max(1, int(job.warn_before_s))}"
        )
    if job.priority < 0:
        argv.append(f"--nice={-job.priority}")
    if job.begin_time is not None:  # Slurm holds it: handed over at once, not at its time
        argv.append(f"--begin={begin_text(job.begin_time)}")
    if deps:
        argv.append(f"--dependency={dependency_arg(deps)}")
    if len(jobs) > 1 or job.array_index is not None:
        indices = ",".join(str(j.array_index) for j in jobs)
        throttle = f"%{job.array_throttle}" if job.array_throttle else ""
        argv.append(f"--array={indices}{throttle}")
    return argv + [script]


def wrapper_script(jobs: list[Job], records_dir: str, env_file: str) -> str:
    """The batch script: a dependency-free bash wrapper (compute nodes may lack gpusched).

    It enters the job's directory or fails (Slurm itself would run the job in /tmp and
    call it COMPLETED), runs the command in the background so that a signal reaches the
    wrapper at once, passes each signal on, and writes a start record and an exit record
    (written whole, then renamed) on the shared directory.
    """
    job = jobs[0]
    q = shlex.quote
    ids = "\n".join(f"  {j.array_index}) id={j.id} ;;" for j in jobs if j.array_index is not None)
    lines = [
        "#!/bin/bash",
        "# gpusched job wrapper (written by the gpusched daemon)",
        f"id={job.id}",
    ]
    if ids:
        lines += [
            'case "${SLURM_ARRAY_TASK_ID:-}" in',
            ids,
            "esac",
            f"export GPUSCHED_ARRAY_ID={job.array_id}",
            'export GPUSCHED_ARRAY_INDEX="${SLURM_ARRAY_TASK_ID:-}"',
        ]
    lines += [
        f"attempt={job.attempt}",
        f"rec={q(records_dir)}/$id.$attempt",
        f"while IFS= read -r -d '' kv; do export \"$kv\"; done < {q(env_file)}",
        'export GPUSCHED_JOB_ID="$id" GPUSCHED_ATTEMPT="$attempt"'
        f" GPUSCHED_NUM_GPUS={job.request.gpus} GPUSCHED_CPUS={max(1, job.request.cpus)}",
        'record() { printf \'%s\\n\' "$2" > "$rec.$1.tmp" && mv -f "$rec.$1.tmp" "$rec.$1"; }',
        'record start "host=$(hostname) slurm_job_id=${SLURM_JOB_ID:-} '
        'job_gpus=${SLURM_JOB_GPUS:-} cuda=${CUDA_VISIBLE_DEVICES:-}"',
        f'cd -- {q(job.cwd)} || {{ record exit "status=1 error=cannot enter the working '
        f'directory"; exit 1; }}',
        f"{' '.join(q(arg) for arg in job.command)} &",
        "child=$!",
    ]
    lines += [f"trap 'kill -{sig} $child 2>/dev/null' {sig}" for sig in FORWARDED]
    lines += [
        # wait returns early when a trapped signal arrives: wait again while it lives.
        'while wait "$child"; status=$?; kill -0 "$child" 2>/dev/null; do :; done',
        'wait "$child" 2>/dev/null; last=$?; [ "$last" -ne 127 ] && status=$last',
        'record exit "status=$status"',
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def env_file_bytes(env: dict[str, str]) -> bytes:
    """The job's environment as NAME=VALUE, each ended by NUL: any value survives (newlines
    too). The Slurm-set variables of the daemon are not the job's: left out."""
    return b"".join(
        f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0"
        for k, v in env.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "GPUSCHED_"))
        and k not in _NOT_EXPORTED
        and "%" not in k
    )


# Not the job's own (its GPUs come from Slurm), or read-only in bash (an export fails).
_NOT_EXPORTED = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "BASHOPTS",
        "SHELLOPTS",
        "BASH_VERSINFO",
        "EUID",
        "PPID",
        "UID",
    }
)


def refuse_if(job: Job, cluster: ClusterConfig) -> None:
    """Exit status 1, not 2: the command line is well formed, the cluster cannot do it."""
    reason = refusal(job, cluster)
    if reason:
        raise GpuschedError(f"cannot hand this job to cluster {cluster.name}: {reason}")

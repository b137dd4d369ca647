"""The one module that runs Slurm's commands (sbatch, squeue, sacct, scancel) for a cluster."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Sequence

from gpusched.core.slurm.clusterconf import ClusterConfig
from gpusched.core.slurm.slurmparse import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SlurmRow,
    parse_sacct,
    parse_squeue,
)

log = logging.getLogger("gpusched.daemon.slurm.commands")

# squeue -j takes this many ids a call at most: one call per 100 jobs per poll.
IDS_PER_CALL = 100
# What squeue says when every id asked for is gone (purged after MinJobAge): not an error.
_ALL_PURGED = "Invalid job id specified"
_NO_ACCOUNTING = ("accounting storage is disabled", "Problem talking to the database")


class SlurmError(Exception):
    """A Slurm command failed (the controller is down, a refusal): its message."""


class SlurmCommands:
    """sbatch, squeue, sacct and scancel of one cluster, run with a clean environment: the
    daemon's own SBATCH_* and SLURM_* variables would override the job's options."""

    def __init__(self, cluster: ClusterConfig, environ: dict[str, str] | None = None):
        self.cluster = cluster
        base = dict(os.environ if environ is None else environ)
        self.env = {
            k: v
            for k, v in base.items()
            if not k.startswith(("SBATCH_", "SLURM_", "SQUEUE_", "SACCT_", "SCANCEL_"))
        }
        conf = cluster.slurm_conf or base.get("SLURM_CONF", "")
        if conf:
            self.env["SLURM_CONF"] = conf
        # How finished jobs are looked up: "" not probed yet, "-X" accounting, "-c" the job
        # completion log (no database), "none": neither (the exit records alone).
        self.sacct_mode = ""
        self.calls = 0  # every command run, for `daemon status` and the tests

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        program = os.path.join(self.cluster.bin_dir, argv[0]) if self.cluster.bin_dir else argv[0]
        self.calls += 1
        try:
            return subprocess.run(
                [program, *argv[1:]],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=self.cluster.command_timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise SlurmError(
                f"{argv[0]} did not answer within {self.cluster.command_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise SlurmError(f"cannot run {program}: {exc.strerror}") from None

    @staticmethod
    def _said(done: subprocess.CompletedProcess[str]) -> str:
        text = (done.stderr or done.stdout).strip().splitlines()
        return text[-1] if text else f"exit status {done.returncode}"

    def sbatch(self, argv: list[str]) -> str:
        """The Slurm job id of a batch job just submitted."""
        done = self._run(argv)
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            raise SlurmError(f"sbatch: {self._said(done)}")
        return job_id

    def squeue(self, keys: list[str]) -> dict[str, SlurmRow]:
        """Every job (finished ones too, until purged) of these ids, in calls of at most
        IDS_PER_CALL ids; a job Slurm forgot is simply not in the result."""
        rows: dict[str, SlurmRow] = {}
        for start in range(0, len(keys), IDS_PER_CALL):
            chunk = keys[start : start + IDS_PER_CALL]
            done = self._run(
                ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(chunk), "-O", SQUEUE_FORMAT]
            )
            if done.returncode != 0 and _ALL_PURGED not in done.stderr:
                raise SlurmError(f"squeue: {self._said(done)}")
            rows.update(parse_squeue(done.stdout))
        return rows

    def own_jobs(self) -> dict[str, SlurmRow]:
        """Every job of this user that Slurm still knows: to find jobs by their marker."""
        done = self._run(["squeue", "-h", "-r", "-t", "all", "--me", "-O", SQUEUE_FORMAT])
        if done.returncode != 0:
            raise SlurmError(f"squeue: {self._said(done)}")
        return parse_squeue(done.stdout)

    def sacct(self, keys: list[str]) -> dict[str, SlurmRow]:
        """Jobs squeue forgot, from accounting (or from the job completion log, `sacct
        -c`, where there is no database); {} where neither is kept."""
        if not keys or self.sacct_mode == "none":
            return {}
        rows: dict[str, SlurmRow] = {}
        for start in range(0, len(keys), IDS_PER_CALL):
            chunk = ",".join(keys[start : start + IDS_PER_CALL])
            done = self._run(
                ["sacct", self.sacct_mode or "-X", "-P", "-j", chunk, "-o", SACCT_FIELDS]
            )
            no_database = done.returncode != 0 and any(n in done.stderr for n in _NO_ACCOUNTING)
            if not self.sacct_mode and no_database:
                done = self._run(["sacct", "-c", "-P", "-j", chunk, "-o", SACCT_FIELDS])
                if done.returncode != 0:  # no job completion log either: records alone
                    log.info("no accounting on cluster %s: %s", self.cluster.name, self._said(done))
                    self.sacct_mode = "none"
                    return rows
                self.sacct_mode = "-c"
            elif done.returncode != 0:  # a passing failure (a slow slurmdbd): poll again
                raise SlurmError(f"sacct: {self._said(done)}")
            self.sacct_mode = self.sacct_mode or "-X"
            rows.update(parse_sacct(done.stdout))
        return rows

    def scancel(self, keys: list[str]) -> None:
        """Ask Slurm to cancel these jobs. Its exit status is 0 even for finished or unknown
        jobs: only a later poll confirms the cancel."""
        if keys:
            done = self._run(["scancel", *keys])
            if done.returncode != 0:
                raise SlurmError(f"scancel: {self._said(done)}")

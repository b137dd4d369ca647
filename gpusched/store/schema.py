"""The queue file's schema: its version and the migration to each version from the one
before. (Every queue file is built by running them in order: store/database.py opens and
migrates; store/integrity.py checks a file against them.)"""

from __future__ import annotations

SCHEMA_VERSION = 15

# Migrations[n] takes a database at version n to n + 1. Version 0 is an empty file.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids are never reused
        name TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL,
        command TEXT NOT NULL,
        cwd TEXT NOT NULL,
        env TEXT NOT NULL,
        uid INTEGER NOT NULL,
        user TEXT NOT NULL,
        submit_pid INTEGER,
        gpus INTEGER NOT NULL,
        gpu_mem_bytes INTEGER,
        priority INTEGER NOT NULL DEFAULT 0,
        submitted_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        exit_code INTEGER,
        signal INTEGER,
        gpu_uuids TEXT NOT NULL DEFAULT '[]',
        gpu_indices TEXT NOT NULL DEFAULT '[]',
        pending_reason TEXT NOT NULL DEFAULT '',
        master_port INTEGER,
        shim_pid INTEGER,
        shim_start_time REAL,
        boot_id TEXT NOT NULL DEFAULT '',
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        stdout_path TEXT NOT NULL DEFAULT '',
        stderr_path TEXT NOT NULL DEFAULT '',
        end_reason TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX jobs_active ON jobs(state) WHERE state IN ('pending', 'running');
    """,
    # 2: scheduling semantics (hold, dependencies, arrays, time limits, retries, policy,
    # GPU constraints) and a key/value table for queue-wide state such as draining.
    """
    ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN dependencies TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE jobs ADD COLUMN kill_on_invalid_dep INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN array_id INTEGER;
    ALTER TABLE jobs ADD COLUMN array_index INTEGER;
    ALTER TABLE jobs ADD COLUMN array_throttle INTEGER;
    ALTER TABLE jobs ADD COLUMN time_limit_s REAL;
    ALTER TABLE jobs ADD COLUMN warn_signal INTEGER;
    ALTER TABLE jobs ADD COLUMN warn_before_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN warned INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN timed_out INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN retry_on TEXT NOT NULL DEFAULT '["failed"]';
    ALTER TABLE jobs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE jobs ADD COLUMN policy TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN constraints TEXT NOT NULL DEFAULT '{}';
    CREATE INDEX jobs_array ON jobs(array_id) WHERE array_id IS NOT NULL;
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 3: host resources (CPUs, host memory) and observed peaks.
    """
    ALTER TABLE jobs ADD COLUMN cpus INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE jobs ADD COLUMN mem_bytes INTEGER;
    ALTER TABLE jobs ADD COLUMN cpu_ids TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE jobs ADD COLUMN mem_peak_bytes INTEGER;
    ALTER TABLE jobs ADD COLUMN gpu_mem_peak_bytes INTEGER;
    ALTER TABLE jobs ADD COLUMN mem_over INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN oom_killed INTEGER NOT NULL DEFAULT 0;
    """,
    # 4: cores as a limit only when asked for (a GPU job stored with the old default of
    # one core did not ask), and a delay before each retry. (Fair-share usage lives in meta.)
    """
    ALTER TABLE jobs ADD COLUMN cpus_required INTEGER NOT NULL DEFAULT 1;
    UPDATE jobs SET cpus_required = 0 WHERE cpus = 1 AND gpus > 0;
    ALTER TABLE jobs ADD COLUMN retry_delay_s REAL NOT NULL DEFAULT 10;
    ALTER TABLE jobs ADD COLUMN eligible_at REAL;
    ALTER TABLE jobs ADD COLUMN last_attempt_end TEXT NOT NULL DEFAULT '';
    """,
    # 5: preemption and requeue (daemon/jobs/requeue.py): a run being stopped to be requeued
    # is stored as such, so that a restart midway neither loses nor repeats it.
    """
    ALTER TABLE jobs ADD COLUMN preemptible INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN preempt_grace_s REAL NOT NULL DEFAULT 60;
    ALTER TABLE jobs ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN requeueing INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN requeue_term_at REAL;
    ALTER TABLE jobs ADD COLUMN requeue_reason TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN preempted_by INTEGER;
    ALTER TABLE jobs ADD COLUMN preempted_at REAL;
    ALTER TABLE jobs ADD COLUMN preempted_jobs TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE jobs ADD COLUMN preempted_jobs_at REAL;
    ALTER TABLE jobs ADD COLUMN preempt_hold TEXT NOT NULL DEFAULT '[]';
    """,
    # 6: GPU memory that learns: the growth of a CUDA-OOM retry, the key runs are filed
    # under for --gpu-mem auto (named jobs get theirs here; an unnamed one's comes from its
    # command, which SQL cannot normalize), why the job's --gpu-mem is what it is, and
    # the interactive flag (exempt from idle_action).
    """
    ALTER TABLE jobs ADD COLUMN mem_growth REAL NOT NULL DEFAULT 1.25;
    ALTER TABLE jobs ADD COLUMN job_key TEXT NOT NULL DEFAULT '';
    UPDATE jobs SET job_key = substr(name, 1, 200) WHERE name != '';
    ALTER TABLE jobs ADD COLUMN gpu_mem_reason TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN interactive INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX jobs_key ON jobs(uid, job_key, id);
    """,
    # 7: a job run in a container: its image and runtime options (JSON), [] for none.
    """
    ALTER TABLE jobs ADD COLUMN container TEXT NOT NULL DEFAULT '[]';
    """,
    # 8: --signal B: (the warning goes to the job's main process only).
    """
    ALTER TABLE jobs ADD COLUMN warn_batch INTEGER NOT NULL DEFAULT 0;
    """,
    # 9: --output/--error: the patterns (their files are in stdout_path, stderr_path)
    # and how the first run opens them, "truncate" or "append"; "" without them.
    """
    ALTER TABLE jobs ADD COLUMN output_pattern TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN error_pattern TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN open_mode TEXT NOT NULL DEFAULT '';
    """,
    # 10: --begin: the time (epoch seconds) before which the job may not start; NULL for none.
    """
    ALTER TABLE jobs ADD COLUMN begin_time REAL;
    """,
    # 11: GPU memory promises: the job's --gpu-mem-over, what its run used past its
    # --gpu-mem, and whether it is being stopped for that.
    """
    ALTER TABLE jobs ADD COLUMN gpu_mem_over TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN gpu_mem_over_by TEXT NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN gpu_mem_stop INTEGER NOT NULL DEFAULT 0;
    """,
    # 12: --pty (the job runs on a terminal that `gpusched attach` connects to).
    """
    ALTER TABLE jobs ADD COLUMN pty INTEGER NOT NULL DEFAULT 0;
    """,
    # 13: runtimes learned from history (core/sched/runtimes.py): the prediction, its 80 %
    # interval and where it came from; NULL and '' without one.
    """
    ALTER TABLE jobs ADD COLUMN predicted_s REAL;
    ALTER TABLE jobs ADD COLUMN predicted_low_s REAL;
    ALTER TABLE jobs ADD COLUMN predicted_high_s REAL;
    ALTER TABLE jobs ADD COLUMN runtime_reason TEXT NOT NULL DEFAULT '';
    """,
    # 14: GPU reservations (core/sched/reservations.py), and the one a job runs in ('': none).
    """
    CREATE TABLE reservations (
        name TEXT PRIMARY KEY,
        gpus TEXT NOT NULL,  -- JSON list of GPU indices
        users TEXT NOT NULL,  -- JSON list of user names
        start_at REAL NOT NULL,
        end_at REAL NOT NULL,
        created_by TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    ALTER TABLE jobs ADD COLUMN reservation TEXT NOT NULL DEFAULT '';
    """,
    # 15: the successful runs a predicted runtime reads at each submit (store/history.py
    # run_seconds), by key, by user and by box: without these a submit walked every pending
    # job of a long queue, and 100 clients submitting at once were four times slower.
    """
    CREATE INDEX jobs_runs_key ON jobs(uid, job_key, id) WHERE state = 'succeeded';
    CREATE INDEX jobs_runs_user ON jobs(uid, id) WHERE state = 'succeeded';
    CREATE INDEX jobs_runs ON jobs(id) WHERE state = 'succeeded';
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION

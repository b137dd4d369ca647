"""Slurm, pure: the `[clusters.NAME]` config, a job as sbatch's argv and wrapper script
(and what cannot be handed over), and what squeue and sacct print, read back.

May import the rest of core (spec/ for values and syntax); the daemon's slurm/ runs the
commands.
"""

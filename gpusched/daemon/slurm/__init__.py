"""The hand-off to a Slurm cluster: sbatch (submit), squeue/sacct reads (poll), the
dependencies Slurm is told, the commands run and their worker thread.

May import the daemon's state only, of the daemon; the Slurm syntax lives in gpusched.core.
"""

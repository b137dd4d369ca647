"""A submitted job's options, pure: Slurm-style syntax (ids, --time, --dependency,
--signal), the checked values of a request and their size limits, the job spec the daemon
checks field by field, output file patterns, a job's default name, and a container job's
command. The submit fast path imports these, so they stay light.

May import the rest of core (jobspec reads core/sched/topology.py for --gpu-ids), nothing else of
gpusched; models.py reads syntax, values and jobname from here.
"""

"""Pure scheduling logic, standard library only: the job model and its legal state
changes, placement, queue disciplines, lifecycle, job-spec checks, units, Slurm
syntax, settings and errors. It imports nothing of gpusched outside core, so the
daemon and the trace simulator run the very same decisions.
"""

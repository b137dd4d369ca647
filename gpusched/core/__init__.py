"""Pure logic, standard library only, so that the daemon and the trace simulator make the
very same decisions. At this level: the job model and its legal state changes (models,
lifecycle), settings (config, configkeys, notifyconf), errors, units, listing filters,
service decisions. In folders: `sched/` (placement and scheduling), `spec/` (a submitted
job's options and their checks) and `slurm/` (what gpusched hands to Slurm and reads back).

Its folders are topics, not layers: they import one another. It imports nothing of gpusched
outside core (tests/test_boundaries.py).
"""

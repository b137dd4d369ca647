"""`submit` on the client's side: the one table of its options, `#SBATCH` lines and the
sbatch options gpusched refuses, `--from-file` sweeps, output files, the job request
built from all of them, and sending it (the fast path imports no typer).
"""

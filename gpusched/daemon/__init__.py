"""The daemon: startup, the loop, and the one state the loop hands to its subsystems.

At this level: `startup` (serve the socket, run the loop), `loop` (one thread that takes
requests and runs each turn), `state` (the active jobs and what each subsystem keeps;
only it sets its attributes, each change through a method named for it),
`host` (cores and memory jobs may use) and two big-queue helpers (`gcfreeze`, `memtrim`).
The subsystems, each in a folder: `requests/` (the socket and every protocol command),
`jobs/` (starting, watching, ending and requeueing jobs), `observe/` (metrics, usage,
notifications), `services/` (inference services and their front doors) and `slurm/` (the
hand-off to a Slurm cluster). The queue's file is `gpusched.store`.

It may import core, gpus, proc, client (paths, protocol), store and job. Nothing imports it
but the CLI's `daemon run` and `python -m gpusched.daemon` (what a client starts), through
`startup`; tests/test_daemon_layout.py keeps the folders' own rules.
"""

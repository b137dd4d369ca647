"""The daemon: its loop, its one state (active jobs, the store, flags), request
handling, job control, the socket server, the SQLite store, authorization, and
host and cgroup accounting. It may import core, proc, gpus and client (paths,
protocol); nothing imports it but the CLI's `daemon run` (and `python -m gpusched.daemon`,
the same without the CLI, which clients start).
"""

"""The job supervisor, a process of its own per home that outlives the daemon: it starts
plain jobs (starts), watches their exits in one loop and appends their exit records (ends),
signals their groups (signals), and forks a shim for a job that needs one (launcher).

Standard library and gpusched.proc only: it is run by path and starts in milliseconds.
The daemon reaches it through gpusched.proc.supervisorclient.
"""

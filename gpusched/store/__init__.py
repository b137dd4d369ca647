"""The queue's SQLite file: its schema and migrations, a Job as a row and back, the
history of finished runs, what one row used, integrity and WAL checks, checkpoints off the
loop's thread, write failures in words, and `gpusched doctor` and its repair.

May import core, proc (the run files) and client (paths, and whether the daemon holds its
lock). Imported by the daemon and by the CLI's `doctor`.
"""

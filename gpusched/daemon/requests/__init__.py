"""Requests: the socket server and its frames (large ones admitted by a byte budget,
streamed ones read part by part, long replies cut into pages), the calls handed to the loop,
the handlers of every protocol command (queries that read, changes that write, submits),
who may do what (authz), per-user queue quotas, and work too big for one turn (batches).

May import the daemon's state, jobs/ (the parts a request asks of them: memory estimates,
requeue, retention, progress, idle GPUs), observe/ (usage), services/, and gpusched.store.
Never the loop, and never daemon/jobs/control.py: the loop passes requests to job control.
"""

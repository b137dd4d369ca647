"""Jobs: starting them (control), learning of their ends (end reports and their
acknowledgements, lost runners), requeue and preemption, dependencies and arrays, idle GPUs,
GPU memory that learns, the resources they use (cgroups, containers, fair share), the
tables of active jobs, when pending ones may start (starttimes), and retention of the
finished ones.

May import the daemon's state and host, daemon/requests/batches.py (retention and memory estimates
work a batch per turn), gpusched.store and the process seam (gpusched.proc.seam). Never
the request handlers, the server or observe/.
"""

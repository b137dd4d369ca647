"""Observing the daemon: /metrics (the collector, its HTTP server, the loop's counters),
`gpusched usage`, and notifications (the queue of events, mail and commands run as the
user, webhooks).

May import the daemon's state, jobs/ (idle GPUs, progress, retention's summaries),
daemon/requests/batches.py, daemon/services/metrics.py and gpusched.store. Nothing here changes a job.
"""

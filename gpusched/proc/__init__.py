"""What runs outside the daemon: the job supervisor (supervisor/), the per-job shim it forks,
the one spawn module both start jobs with and their word to the daemon (runreport), the
run-file and wake formats, privilege dropping, the seam through which the daemon sees
and signals processes (seam, supervisorclient), and NVIDIA MPS's control daemon (mps). It
never imports the daemon; the runners' side imports only the standard library.
"""

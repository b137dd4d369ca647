"""What runs outside the daemon: the job supervisor, the per-job shim it forks, the one
spawn module both start jobs with, the run-file and wake formats, privilege dropping, and the seam through which the daemon
sees and signals processes. It never imports the daemon; the shim side imports
only the standard library.
"""

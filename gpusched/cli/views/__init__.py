"""What the commands print: `ls`, `show`, `gpus`, `service` and `daemon status` as people
read them, as plain lines without rich on every path (lsview, plainout, show, statusview),
fitted to the terminal (columns), and nvidia-smi's shapes (gpuquery, topomatrix).

May import core, client and proc's formats; never the daemon.
"""

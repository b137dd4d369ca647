"""What the commands print: `ls`, `show`, `gpus`, `service` and `daemon status` as people
read them, with rich (richviews) or as plain lines without it (lsview, plainout, show),
fitted to the terminal (columns), and nvidia-smi's shapes (gpuquery, topomatrix).

May import core, client and proc's formats; never the daemon.
"""

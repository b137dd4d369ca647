"""`gpusched top`: snapshot model, pure rendering, drawing primitives, the snapshot
source, keys and the Live loop. It never imports gpus (but for the snapshot
source's fallback), the store or the daemon.
"""

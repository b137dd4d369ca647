"""`gpusched top`: the snapshot model, pure rendering, drawing primitives (ls uses
them too), the snapshot source, keys and the Live loop. It imports core and
client only: never gpus (the command line hands the snapshot source its GPU
backend opener), the store or the daemon.
"""

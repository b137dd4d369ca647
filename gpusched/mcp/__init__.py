"""`gpusched mcp`: a Model Context Protocol server through which AI assistants use the queue.

A client of the daemon, as cli/ is: it asks over the daemon's socket as the user who runs
it, and the daemon's own identity checks decide. May import core, client and proc (to read
a job's log as its owner), never daemon, store or cli. Only this folder imports the `mcp`
SDK (an optional extra); nothing else of gpusched imports this folder but
cli/commands/mcp_cmds.py, and that only once the SDK is found.
"""

"""The typer commands, one module per topic (`*_cmds.py`), and the commands that are
programs of their own (`simulate`, `demo`). Each parses its options, asks the daemon
through gpusched.client, and prints with cli/views/.
"""

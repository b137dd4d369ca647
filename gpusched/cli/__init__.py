"""The command line: the typer app (app.py, with main()) and its command modules
(*_cmds.py), the only importers of typer; human and nvidia-smi-style output,
completions, service units and the demo. Nothing outside cli imports cli.
"""

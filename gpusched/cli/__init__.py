"""The command line: the typer app (the only importer of typer), human and
nvidia-smi-style output, completions, service units and the demo. Nothing
imports cli.
"""

"""gpusched: a GPU scheduler and job runner for shared GPU workstations and servers."""

__version__ = "0.1.0"

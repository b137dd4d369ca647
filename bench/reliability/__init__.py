"""The parts of bench/reliability.py: one module per kind of trouble, each returning figures."""

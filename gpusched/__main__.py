"""`python -m gpusched` runs the command line."""

from gpusched.cli.entry import main

main()

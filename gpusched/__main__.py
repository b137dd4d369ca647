"""`python -m gpusched` runs the command line."""

from gpusched.entry import main

main()

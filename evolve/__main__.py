"""``python -m evolve``: the ``evolve`` command line."""

from evolve.cli import main

main()

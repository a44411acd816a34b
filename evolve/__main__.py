"""``python -m evolve``: the ``evolve`` command line."""

from evolve.cli.commands import main

main()

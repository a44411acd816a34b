"""The ``evolve`` command line: ``main`` (run, eval, init, serve, mcp, and the subcommands of the
surfaces' own packages), ``archive`` (``evolve archive``) and ``progress`` (the terminal's progress)."""

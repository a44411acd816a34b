"""The ``evolve`` command line: ``commands`` (run, eval, init, serve, mcp, and the subcommands of the
surfaces' own packages) and ``archive`` (``evolve archive``)."""


def __getattr__(name: str):
    # `evolve = "evolve.cli:main"`: the command's entry point, imported on first use so that
    # `evolve.cli.archive` loads without typer's whole app
    if name in ("app", "main"):
        import importlib

        return getattr(importlib.import_module("evolve.cli.commands"), name)
    raise AttributeError(f"module 'evolve.cli' has no attribute {name!r}")

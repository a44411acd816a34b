"""The task file: what a user writes and what a run was started with.

* ``config`` — the schema (frozen pydantic models, ``extra="forbid"``);
* ``taskfile`` — reading a task file: YAML, ``--set`` overrides, a world's defaults, checks;
* ``data`` — datasets: a generator callable or JSONL files, split into train / val / test;
* ``reference`` — the task-file reference, generated from the schema;
* ``fingerprint`` — which configuration a run directory was started with (what a resume must match);
* ``content`` — each task's content hash, recorded in the run (which tasks two runs share);
* ``deploy`` — the ``deploy:`` section (gates, canary, approval) that :mod:`evolve.deploy` carries out.

Imports only the foundations (``evolve.types``, ``errors``, ``registry``, the model params of
``evolve.llm.params``, and the World protocol of ``evolve.world``).
"""

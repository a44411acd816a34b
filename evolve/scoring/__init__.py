"""Scoring: the session that scores systems on a task's splits (one rollout is :mod:`evolve.rollout`,
the world failing under it :mod:`evolve.failures`).

* ``retry`` — a rollout the world failed under is retried, never scored;
* ``session`` — splits, the runner, memoised rollouts, the ledger; ``budget`` and ``estimate`` (the dry run);
  ``holdout`` — the gate split, held out of the run's own selection;
* ``recorder`` — writing a batch of rollouts down as it runs;
* ``state`` — the run state the loop's parts share; ``rundir`` — a run directory's life;
* ``bootstrap`` — the starting system Π₀ built from the task file;
* ``progress`` — the terminal's display of a session's progress (an ``Observer``).

Imports the floors below it (the foundations, ``evolve.task``, the gateway, the agent contract and
the runners); never the results, deploy, the loop or the surfaces above it. ``rollout`` and
``failures`` here are deprecated aliases of their new homes.
"""

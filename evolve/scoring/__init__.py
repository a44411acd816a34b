"""Scoring: one rollout, and the session that scores systems on a task's splits.

* ``rollout`` — one rollout: the agent's context, every step recorded, the reward;
* ``failures`` and ``retry`` — the agent failing against the world failing under it (retried, never scored);
* ``session`` — splits, the runner, memoised rollouts, the ledger; ``budget`` and ``estimate`` (the dry run);
* ``recorder`` — writing a batch of rollouts down as it runs;
* ``state`` — the run state the loop's parts share; ``rundir`` — a run directory's life;
* ``bootstrap`` — the starting system Π₀ built from the task file.

Imports ``evolve.task`` and the foundations (archive, llm, runners), and, lazily, the gateway's
rollout route when an agent asks for its own OpenAI URL; never the results or the loop above it.
"""

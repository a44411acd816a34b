"""``evolve baseline``: other optimisers on the same task file, scored like an evolved system.

Mounted by :mod:`evolve.cli.commands` as ``app.add_typer(baseline_app, name="baseline")``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from evolve.prompts.baselines import OPTIMIZERS

baseline_app = typer.Typer(
    name="baseline",
    no_args_is_help=True,
    add_completion=False,
    help="Baselines from other optimisers on the same task, data, model and metric.",
)


@baseline_app.callback()
def _group() -> None:
    """Baselines from other optimisers on the same task, data, model and metric."""


@baseline_app.command("dspy")
def dspy_baseline(
    task_file: Path = typer.Argument(..., help="The task YAML (its agent must be a DSPy program)."),
    optimizer: str = typer.Option("bootstrap", "--optimizer", help=f"One of {', '.join(OPTIMIZERS)}."),
    budget: int | None = typer.Option(
        None,
        "--budget",
        help="LLM calls the optimiser may spend (mapped onto its "
        "knobs; the calls spent are reported). Default: DSPy's own (auto=light).",
    ),
    threshold: float | None = typer.Option(
        None, "--threshold", help="Reward a bootstrapped demo must reach (default: DSPy's, any non-zero score)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default runs/NAME-seedN-dspy-OPTIMIZER)."),
    set_: list[str] = typer.Option([], "--set", help="Override any task-file field, e.g. --set seed=1 (repeatable)."),
) -> None:
    """Compile the task's DSPy program with dspy.BootstrapFewShot, MIPROv2 or GEPA and score it on the
    test split through the engine's rollouts; writes RUN_DIR/dspy_baseline.json."""
    from rich.console import Console

    from evolve.prompts.baselines import run_dspy_baseline

    r = run_dspy_baseline(task_file, optimizer, budget=budget, overrides=set_, out=out, threshold=threshold)
    b, c, spent = r["baseline"], r["compiled"], r["spent"]
    con = Console(highlight=False, soft_wrap=True)
    con.print(
        f"{r['dspy_class']} on {r['task']} (seed {r['seed']}): {spent['llm_calls']} LLM calls, "
        f"{spent['metric_calls']} metric calls, {r['compile_seconds']} s"
        + (f", budget {r['budget']['llm_calls']}" if r["budget"]["llm_calls"] is not None else "")
    )
    con.print(
        f"{r['split']}: starting program {100 * b['score']:.1f}% (n={b['n']}) -> compiled "
        f"{100 * c['score']:.1f}% (n={c['n']})   system {c['system_id'][:12]}"
    )
    con.print(f"results: {r['run_dir']}/dspy_baseline.json")


__all__ = ["baseline_app"]

"""What the MCP tools answer about runs, read-only: a run's status while it goes, its report read
with its intervals, two systems compared, stored rollouts, the runs under a folder, a gateway's
traffic. Every answer is JSON, clipped (:func:`clip`) so that one answer fits a model's context.

The reading reuses the dashboard's views (:mod:`evolve.ui.run`, :mod:`evolve.ui.system`,
:mod:`evolve.ui.traffic`): an archive opened with SQLite's ``mode=ro``, so nothing here can change
a run, and a run still being written can be read.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evolve.failures import most_common
from evolve.results.stats import bounds, describe, interval_text

MAX_TEXT = 2000  # characters of one string in an answer
MAX_ITEMS = 50  # items of one list in an answer
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "artifacts", "work", "mcp", ".cache"}


def clip(value: Any, text: int = MAX_TEXT, items: int = MAX_ITEMS) -> Any:
    """``value`` with long strings and lists cut (saying how much was left out)."""
    if isinstance(value, str):
        return value if len(value) <= text else value[:text] + f"... [{len(value) - text} more characters]"
    if isinstance(value, dict):
        return {k: clip(v, text, items) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        head = [clip(v, text, items) for v in list(value)[:items]]
        return head + ([f"... [{len(value) - items} more]"] if len(value) > items else [])
    return value


@contextlib.contextmanager
def opened(run_dir: Path, rid: str) -> Iterator[Any]:
    from evolve.errors import RunDirError
    from evolve.ui.run import RunView

    if not (run_dir / "archive.sqlite").exists():
        raise RunDirError(f"{rid} holds no run yet (no archive.sqlite)")
    view = RunView(run_dir, rid)
    try:
        yield view
    finally:
        view.close()


def _failures(view: Any) -> dict[str, Any]:
    """Per split: rollouts stored, those that failed by the agent's or the reward's own error (with
    their most common messages), and the world failures that were retried (never scored)."""
    out: dict[str, Any] = {}
    for (split, _phase), c in sorted(view.archive.rollout_counts().items()):
        row = out.setdefault(split, {"rollouts": 0, "failed": 0, "reward_errors": 0, "world_failures": 0})
        for k in ("rollouts", "failed", "reward_errors"):
            row[k] += c[k]
    for split, row in out.items():
        if row["failed"] or row["reward_errors"]:
            _, msgs = view.archive.failure_stats(phase=None, split=split)
            row["common"] = [[clip(m, 300), n] for m, n in most_common(msgs, 3)]
    for e in view.archive.events("world_failure"):
        row = out.setdefault(e.get("split", "?"), {"rollouts": 0, "failed": 0, "reward_errors": 0, "world_failures": 0})
        row["world_failures"] += 1
    return out


def status(run_dir: Path, rid: str, job: dict[str, Any] | None, log_tail: str) -> dict[str, Any]:
    """Where a run is: its state, generation, budgets spent against their limits, the baseline and
    the best so far with their intervals, the failures, and what to do next."""
    out: dict[str, Any] = {"run_id": rid, "run_dir": str(run_dir)}
    if job is not None:
        out.update({k: job[k] for k in ("state", "pid", "exit_code", "started", "ended", "attempts")})
    if (run_dir / "archive.sqlite").exists():
        with opened(run_dir, rid) as view:
            s = view.summary()
            out.setdefault("state", s["status"])
            if out["state"] == "stopped" and s["status"] in ("finished", "failed"):  # its process gone without a
                out["state"] = s["status"]  # word after the run ended: the run's own status says so
            out.update(
                {
                    "task": s["name"],
                    "seed": s["seed"],
                    "generation": s["generation"],
                    "generations": (view.task().get("budget") or {}).get("generations"),
                    "systems": s["systems"],
                    "spent": s["used"],
                    "limits": s["budget"],
                    "baseline": s["baseline"],
                    "best": s["best"],
                    "current": s["current"],
                    "stop_reason": s["stop_reason"],
                    "failures": _failures(view),
                    "report_ready": view.report() is not None,
                }
            )
    else:
        out.setdefault("state", "starting")
        out["generation"] = None
    state = out["state"]
    if state not in ("running", "finished", "starting") and log_tail:
        out["log_tail"] = log_tail
    out["next"] = {
        "running": "poll run_status, or wait_run for progress; stop_run interrupts it (resume_run continues)",
        "starting": "poll run_status; the run has not written its archive yet",
        "finished": "read it with report; compare_systems shows what changed",
        "failed": "read log_tail and failures; fix the task or agent, then resume_run or start_run fresh=true",
        "refused": "the task file or an argument was refused: read log_tail, fix it, start_run again",
        "world_failed": "the world failed (model unreachable, rate limit, bad key): fix it, then resume_run",
        "stopped": "resume_run continues it without repeating finished work",
    }.get(state, "run_status again")
    return out


def report(run_dir: Path, rid: str) -> dict[str, Any]:
    """The finished run's report (report.json, without its lineage), with a reading of each
    split's paired comparison in words: the gain with its 95% interval, never a bare point gain."""
    from evolve.errors import RunDirError
    from evolve.results.report import read_report

    rep = read_report(run_dir)
    if rep is None:
        raise RunDirError(f"{rid} has no report yet (it is written when the run ends); poll run_status")
    reading = []
    for split, c in (rep.get("paired") or {}).items():
        if not c or not c.get("n"):
            reading.append(f"{split}: the baseline and the best share no scored tasks; no comparison")
            continue
        line = f"{split} ({c['n']} tasks, best vs baseline): {describe(c)}"
        lh = bounds(c)  # within [-100, 100] points
        if lh is not None:
            lo, hi = 100 * lh[0], 100 * lh[1]
            line += f"; interval [{lo:+.1f}, {hi:+.1f}] points"
            if lo <= 0 <= hi:
                line += " includes 0: this is no evidence of a gain"
        if c["n"] < 30:
            line += f"; only {c['n']} tasks: the interval is wide"
        reading.append(line)
    if rep.get("best", {}).get("system_id") == rep.get("baseline", {}).get("system_id"):
        reading.append("the best system is the baseline: nothing tried beat it")
    keep = (
        "task",
        "seed",
        "run_dir",
        "baseline",
        "best",
        "paired",
        "stop_reason",
        "budget_used",
        "budget",
        "failures",
        "reward_range",
        "out_of_range",
        "environment",
    )
    out = {k: rep.get(k) for k in keep if k in rep}
    out["generations"] = [
        {k: g.get(k) for k in ("index", "best_val", "best", "children", "accepted", "rollouts")}
        for g in rep.get("generations", [])
    ]
    out["reading"] = reading
    out["report_md"] = str(run_dir / "report.md")
    return clip(out)


def compare(a_dir: Path, a_id: str, a: str, b_dir: Path, b_id: str, b: str) -> dict[str, Any]:
    """Two systems (of one run or two): the component diff, each one's scores, and on the tasks
    both were scored on the paired gain of ``b`` over ``a`` with the tasks each wins."""
    from evolve.ui.system import compare as compare_views

    with opened(a_dir, a_id) as va, contextlib.nullcontext(va) if b_dir == a_dir else opened(b_dir, b_id) as vb:
        c = compare_views(va, a, vb, b)
    tasks = {}
    for split, t in c["tasks"].items():
        t = dict(t)
        if t.get("n"):
            ci = f" ({interval_text(t)})" if bounds(t) is not None else ""
            t["reading"] = (
                f"b - a: {100 * t['diff']:+.1f} points{ci} on {t['n']} tasks both were scored on; b better "
                f"on {t['b_only']}, a on {t['a_only']}; sign test p={t['p']:.2g}"
            )
        else:  # nothing pairs: no interval, no test
            t["reading"] = f"no task in common: {t.get('why') or 'no task both were scored on'}"
        tasks[split] = t
    return clip(
        {
            "a": {"run_id": a_id, "id": c["a"]["id"], "scores": c["a"]["scores"]},
            "b": {"run_id": b_id, "id": c["b"]["id"], "scores": c["b"]["scores"]},
            "diff": c["diff"],
            "tasks": tasks,
        },
        items=25,
    )


def trajectories(
    run_dir: Path,
    rid: str,
    system: str,
    *,
    seq: int | None,
    split: str | None,
    failed: bool,
    task_id: str | None,
    limit: int,
) -> dict[str, Any]:
    """One stored rollout whole (``seq``), or a page of a system's rollouts to choose from."""
    from evolve.ui.system import rollouts, trajectory

    with opened(run_dir, rid) as view:
        if seq is not None:
            one = trajectory(view, seq)
            for step in one["trajectory"].get("steps") or []:  # token ids and log-probs: counted, not listed
                for key in ("token_ids", "logprobs", "prompt_token_ids", "token_texts"):
                    if isinstance(step.get(key), list):
                        step[key] = f"[{len(step[key])} items]"
            return clip(one, text=4000)
        page = rollouts(view, system, split=split, phase=None, failed=failed, task=task_id, limit=limit)
    page["hint"] = "pass seq (a row's seq) to see that rollout whole: messages, tool calls, reward, error"
    return clip(page)


def find_runs(folders: list[Path], *, max_depth: int = 4, limit: int = 200) -> list[Path]:
    """Run directories under ``folders``, at most ``max_depth`` deep: those holding archive.sqlite,
    and those a server started a run in (``mcp/job.json``), whose archive may not exist yet."""
    from evolve.mcp.jobs import JOB_FOLDER

    found: list[Path] = []
    for top in folders:
        base = len(top.parts)
        for here, dirs, files in os.walk(top):
            if "archive.sqlite" in files or (JOB_FOLDER in dirs and (Path(here) / JOB_FOLDER / "job.json").is_file()):
                found.append(Path(here))
            depth = len(Path(here).parts) - base
            dirs[:] = (
                sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")) if depth < max_depth else []
            )
            if len(found) >= limit:
                return found
    return found


def traces(store: Path, rid: str, sessions: int = 10) -> dict[str, Any]:
    """A gateway's trace store: calls, sessions and feedback counted, per route and serving system
    the sessions and the mean of their first scores, and the newest sessions."""
    from evolve.ui.traffic import TrafficView

    if not (store / "traces.sqlite").exists():
        from evolve.errors import UserError

        raise UserError(
            f"{rid} is not a gateway trace store (no traces.sqlite); give the folder evolve gateway --store wrote"
        )
    view = TrafficView(store, rid)
    try:
        out = view.summary()
        out["newest_sessions"] = view.sessions(limit=sessions)["rows"]
    finally:
        view.close()
    return clip(out)


__all__ = ["clip", "compare", "find_runs", "report", "status", "traces", "trajectories"]

"""One system as the dashboard shows it: what it is, how it differs from its parent, why it was
accepted or not (with the numbers and the rollouts behind the decision), its scores, and which
tasks it solves that its parent did not; and the rollouts themselves."""

from __future__ import annotations

import difflib
from typing import Any

from evolve.archive import diff as diff_systems
from evolve.errors import ArchiveError
from evolve.results.pairing import same_tasks
from evolve.results.stats import paired
from evolve.ui.run import NotFound, RunView

LONG = 80  # strings longer than this (or with newlines) are shown as a line diff
TASK_LIST = 200  # tasks listed per side of a comparison (the counts are always whole)
ROW_COLUMNS = (
    "seq",
    "key",
    "split",
    "phase",
    "generation",
    "task_id",
    "sample",
    "score",
    "error",
    "reward_error",
    "tokens",
    "calls",
    "duration",
)


def resolve(run: RunView, ref: str) -> str:
    """A system id from an id prefix or a word: ``best`` (the run's promoted best), ``baseline``, ``current``."""
    marked = run.marks().get(ref)
    if marked:
        return marked
    try:
        return run.archive.resolve(ref)
    except ArchiveError as e:
        raise NotFound(str(e)) from None


def system_json(run: RunView, sid: str) -> dict[str, Any]:
    return run.archive.get_system(sid).model_dump(mode="json")


def component_diff(a: dict[str, Any] | None, b: dict[str, Any]) -> list[dict[str, Any]]:
    """The differences of ``b`` from ``a`` (:func:`evolve.archive.diff`), long texts as line diffs."""
    if a is None:
        return []
    out = []
    for path, x, y in diff_systems(a, b):
        entry: dict[str, Any] = {"path": path, "before": x, "after": y}
        if isinstance(x, str) and isinstance(y, str) and (len(x) > LONG or len(y) > LONG or "\n" in x + y):
            entry["lines"] = list(
                difflib.unified_diff(x.splitlines(), y.splitlines(), "parent", "child", lineterm="", n=2)
            )[2:]
        out.append(entry)
    return out


def task_scores(run: RunView, sid: str, split: str, *, generation: int | None = None) -> dict[str, float]:
    """Each task's mean eval score (:meth:`Archive.task_scores`), or over the rollouts filed under one generation."""
    if generation is None:
        return run.archive.task_scores(sid, split)
    return {
        t: float(s)
        for t, s in run.sql(
            "SELECT task_id, AVG(score) FROM trajectories WHERE system_id = ? AND split = ? AND phase = 'eval' "
            "AND generation = ? GROUP BY task_id",
            (sid, split, generation),
        )
    }


def versus(
    a: dict[str, float], b: dict[str, float], *, pair: list[str] | None = None, why: str | None = None
) -> dict[str, Any]:
    """``b`` against ``a`` task by task: the paired statistics, the tasks ``b`` does better on
    (``fixed``) and worse on (``broke``), and of the ties how many both solve (score 1 or more),
    both miss (0 or less) and both score the same in between (``tied``). ``pair``: the tasks that
    are the same task in both (default: every id both scored); ``unpaired`` counts the ids both
    scored that are left out, and ``why`` says why."""
    both = set(a) & set(b)
    common = sorted(both if pair is None else both & set(pair))
    fixed = [t for t in common if b[t] > a[t]]
    broke = [t for t in common if b[t] < a[t]]
    same = [a[t] for t in common if b[t] == a[t]]
    return {
        **paired({t: a[t] for t in common}, {t: b[t] for t in common}),
        "fixed": fixed[:TASK_LIST],
        "broke": broke[:TASK_LIST],
        "n_fixed": len(fixed),
        "n_broke": len(broke),
        "both": sum(1 for x in same if x >= 1),
        "neither": sum(1 for x in same if x <= 0),
        "tied": sum(1 for x in same if 0 < x < 1),
        "unpaired": len(both) - len(common),
        "why": why,
    }


def detail(run: RunView, ref: str) -> dict[str, Any]:
    sid = resolve(run, ref)
    return run.cached(("system", sid), lambda: _detail(run, sid))


def _detail(run: RunView, sid: str) -> dict[str, Any]:
    rec = run.archive.record(sid)
    system = system_json(run, sid)
    parent_id = rec.parents[0] if rec.parents else None
    parent = system_json(run, parent_id) if parent_id else None
    info = dict(rec.info)
    curve = info.pop("curve", None)
    decision = run.decisions().get(sid)
    splits = ["train", "val", "test", *run.other_splits()]
    scores = {split: run.score(sid, split) for split in splits}
    out: dict[str, Any] = {
        "id": sid,
        "operator": rec.operator,
        "rationale": rec.rationale,
        "generation": rec.generation,
        "created_at": rec.created_at,
        "parents": list(rec.parents),
        "info": info,
        "curve": curve,
        "system": system,
        "diff": component_diff(parent, system),
        "decision": decision,
        "scores": scores,
        "splits": splits,
        "marks": [k for k, v in run.marks().items() if v == sid],
        "deploy": run.deploy_states().get(sid),
        "deploy_trail": [e for e in run.archive.events("deploy") if e.get("system") == sid],
        "rollouts": [
            {"split": s, "phase": p, "n": n, "failed": int(f or 0), "mean": m}
            for s, p, n, f, m in run.sql(
                "SELECT split, phase, COUNT(*), SUM(error), AVG(score) FROM trajectories WHERE system_id = ? "
                "GROUP BY split, phase ORDER BY split, phase",
                (sid,),
            )
        ],
        "children": [c for (c,) in run.sql("SELECT child FROM lineage WHERE parent = ? AND position = 0", (sid,))],
    }
    if parent_id:
        out["vs_parent"] = {
            split: versus(task_scores(run, parent_id, split), task_scores(run, sid, split)) for split in ("val", "test")
        }
        if decision is not None:  # the evidence: both on the generation's minibatch (the child's first train rollouts;
            g = decision["generation"]  # the parent's may be memoised from an earlier generation)
            mine = task_scores(run, sid, "train", generation=g)
            theirs = {t: v for t, v in task_scores(run, parent_id, "train").items() if t in mine}
            out["evidence"] = {"generation": g, "minibatch": versus(theirs, mine)}
    return out


def rollouts(
    run: RunView,
    ref: str,
    *,
    split: str | None = None,
    phase: str | None = None,
    failed: bool = False,
    task: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """A page of the system's stored rollouts (bookkeeping only; :func:`trajectory` has the rest)."""
    sid = resolve(run, ref)
    where, args = ["system_id = ?"], [sid]
    for col, val in (("split", split), ("phase", phase), ("task_id", task)):
        if val:
            where.append(f"{col} = ?")
            args.append(val)
    if failed:
        where.append("(error = 1 OR reward_error = 1)")
    q = " AND ".join(where)
    total = run.sql(f"SELECT COUNT(*) FROM trajectories WHERE {q}", tuple(args))[0][0]
    rows = run.sql(
        f"SELECT {', '.join(ROW_COLUMNS)} FROM trajectories WHERE {q} ORDER BY seq LIMIT ? OFFSET ?",
        (*args, max(1, min(int(limit), 500)), max(0, int(offset))),
    )
    return {"system": sid, "total": total, "rows": [dict(zip(ROW_COLUMNS, r)) for r in rows]}


def trajectory(run: RunView, seq: int | str) -> dict[str, Any]:
    """One stored rollout whole: its bookkeeping, the trajectory (messages, tool calls, reward) and,
    for each model call with token ids, the text of each sampled token (when the tokenizer is known)."""
    if not str(seq).isdigit() or int(seq) >= 2**62:
        raise NotFound(f"no rollout {seq!r} in {run.run_dir}")
    rows = run.sql(f"SELECT {', '.join(ROW_COLUMNS)} FROM trajectories WHERE seq = ?", (int(seq),))
    if not rows:
        raise NotFound(f"no rollout {seq} in {run.run_dir}")
    head = rows[0]
    traj = run.archive.get_trajectories([head[1]])[head[1]].model_dump(mode="json")
    from evolve.ui.tokens import token_texts

    pieces = token_texts(run, traj)
    for i, step in enumerate(traj.get("steps") or []):
        if i in pieces:
            step["token_texts"] = pieces[i]
    return {"row": dict(zip(ROW_COLUMNS, head)), "trajectory": traj}


def matrix(run: RunView, split: str = "val") -> dict[str, Any]:
    """Per accepted system (and the baseline): how many ``split`` tasks it does better and worse on
    than its parent, with the per-task grid when it is small enough to draw."""
    return run.cached(("matrix", split), lambda: _matrix(run, split))


def _matrix(run: RunView, split: str) -> dict[str, Any]:
    accepted = [a.system_id for a in run.runstate.accepted()]
    baseline = run.runstate.baseline
    ids = list(dict.fromkeys(([baseline] if baseline else []) + accepted))
    parents = dict(run.sql("SELECT child, parent FROM lineage WHERE position = 0"))
    need = set(ids) | {parents[i] for i in ids if i in parents}
    per: dict[str, dict[str, float]] = {}
    for chunk_start in range(0, len(need), 500):
        chunk = sorted(need)[chunk_start : chunk_start + 500]
        for sid, tid, s in run.sql(
            f"SELECT system_id, task_id, AVG(score) FROM trajectories WHERE split = ? AND phase = 'eval' AND "
            f"system_id IN ({','.join('?' * len(chunk))}) GROUP BY system_id, task_id",
            (split, *chunk),
        ):
            per.setdefault(sid, {})[tid] = float(s)
    ops = dict(run.sql("SELECT id, operator FROM systems"))
    gens = dict(run.sql("SELECT id, generation FROM systems"))
    rows = []
    for sid in ids:
        mine, p = per.get(sid, {}), parents.get(sid)
        row: dict[str, Any] = {
            "id": sid,
            "parent": p,
            "operator": ops.get(sid),
            "generation": gens.get(sid),
            "tasks": len(mine),
            "mean": sum(mine.values()) / len(mine) if mine else None,
        }
        if p is not None and p in per:
            v = versus(per[p], mine)
            row.update(fixed=v["n_fixed"], broke=v["n_broke"], both=v["both"], neither=v["neither"], tied=v["tied"])
        rows.append(row)
    tasks = sorted({t for sid in ids for t in per.get(sid, {})})
    grid = None
    if len(tasks) <= 400 and len(ids) <= 100:
        grid = {"tasks": tasks, "scores": [[per.get(sid, {}).get(t) for t in tasks] for sid in ids]}
    return {"split": split, "splits": ["val", "test", "train", *run.other_splits()], "rows": rows, "grid": grid}


def compare(a_run: RunView, a_ref: str, b_run: RunView, b_ref: str) -> dict[str, Any]:
    """Two systems side by side (from one run or two): their components, the diff, their scores
    and, on the tasks both were scored on that are the same task in both runs
    (:func:`evolve.results.pairing.same_tasks`), which each does better."""
    a, b = resolve(a_run, a_ref), resolve(b_run, b_ref)
    sa, sb = system_json(a_run, a), system_json(b_run, b)
    tasks = {}
    for s in ("val", "test"):
        ta, tb = task_scores(a_run, a, s), task_scores(b_run, b, s)
        pair, why = same_tasks(a_run.archive, b_run.archive, s, set(ta) & set(tb))
        tasks[s] = versus(ta, tb, pair=pair, why=why)
    return {
        "a": {"run": a_run.id, "id": a, "system": sa, "scores": {s: a_run.score(a, s) for s in ("val", "test")}},
        "b": {"run": b_run.id, "id": b, "system": sb, "scores": {s: b_run.score(b, s) for s in ("val", "test")}},
        "diff": component_diff(sa, sb),
        "tasks": tasks,
    }

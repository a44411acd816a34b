"""The dashboard on a large archive: how fast its first page and views answer, and the server's memory.

    python bench/infra/ui_speed.py [--systems 10000] [--trajectories 1000000] [--out DIR] [--browser]

Builds (once per size, reused after) a synthetic run: ``--systems`` systems over 100 generations,
each generation's children drawn from the accepted systems so far (about one in ten accepted, with
its decision event), and ``--trajectories`` val rollouts spread evenly over the systems (each a
two-step trajectory like the SQL world's: a model call and a tool call, about 0.6 KB of JSON).
Rows are written with SQL straight into the archive's schema: the archive's own writer would take
an hour for a million. Then ``evolve ui`` serves it in a process of its own and each view is timed
from a client on loopback, cold (the first request after the server started) and warm (again, the
run unchanged), with the server's resident memory (VmRSS, peak VmHWM) from /proc. ``--browser``
also times headless Chromium from navigation to the drawn first page and the drawn lineage.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VAL_TASKS = 100


def build(run: Path, n_systems: int, n_traj: int, seed: int = 0) -> None:
    from evolve.archive import Archive
    from evolve.types import System

    rnd = random.Random(seed)
    with Archive(run):  # the schema, nothing else
        pass
    db = sqlite3.connect(run / "archive.sqlite", isolation_level=None)
    db.execute("PRAGMA synchronous = OFF")
    db.execute("BEGIN")
    now = time.time() - 86_400
    gens = 100
    per_gen = max(1, (n_systems - 1) // gens)
    accepted = []
    systems, lineage, events = [], [], []

    def add(sid: str, parent: str | None, gen: int, prompt: str, op: str) -> None:
        data = System(prompts={"instruction": prompt}).model_dump_json()
        systems.append((sid, op, f"{op}: set the instruction", gen, "{}", now + gen, 0, data.encode()))
        if parent:
            lineage.append((sid, 0, parent, op, "", gen, now + gen))

    base = System(prompts={"instruction": "write sql"}).id
    add(base, None, 0, "write sql", "init")
    accepted.append((base, 0.30, 0))
    best = (0.30, base)
    k = 0
    for g in range(1, gens + 1):
        for _ in range(per_gen if g < gens else n_systems - 1 - per_gen * (gens - 1)):
            parent = rnd.choice([x for x in accepted[-30:] if x[2] < g] or accepted[:1])[0]  # from earlier generations
            prompt = f"write sql, variant {k}"
            sid = System(prompts={"instruction": prompt}).id
            add(sid, parent, g, prompt, rnd.choice(["prompt_mutation", "reflective", "star"]))
            score = min(1.0, max(0.0, rnd.gauss(best[0] - 0.02, 0.05)))
            ok = score > best[0] - 0.01 and rnd.random() < 0.25
            why = f"{'accepted' if ok else 'rejected at stage 2'}: val {score:.3f} vs {best[0]:.3f}"
            events.append(
                (
                    "decision",
                    json.dumps(
                        {"generation": g, "child": sid, "parent": parent, "operator": "x", "accepted": ok, "why": why}
                    ),
                    now + g,
                )
            )
            if ok:
                accepted.append((sid, score, g))
                best = max(best, (score, sid))
            k += 1
    db.executemany(
        "INSERT INTO systems (id, operator, rationale, generation, info, created_at, enc, data) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        systems,
    )
    db.executemany("INSERT INTO lineage VALUES (?, ?, ?, ?, ?, ?, ?)", lineage)
    db.executemany("INSERT INTO events (kind, data, created_at) VALUES (?, ?, ?)", events)
    template = json.dumps(
        {
            "task_id": "TASK",
            "system_id": "SID",
            "steps": [
                {
                    "kind": "llm",
                    "role": "policy",
                    "model": "tiny",
                    "messages": [
                        {
                            "role": "user",
                            "content": "schema: pet(id,name,age,owner_id) owner(id,name,city)\nq: how many pets "
                            "are older than 3?",
                        }
                    ],
                    "output": "select count(*) from pet where age > 3",
                    "prompt_tokens": 60,
                    "completion_tokens": 14,
                    "duration": 0.05,
                },
                {
                    "kind": "tool",
                    "name": "execute_sql",
                    "args": {"db": "/data/db/val.sqlite", "sql": "select count(*) from pet where age > 3"},
                    "result": [[4]],
                    "duration": 0.001,
                },
            ],
            "output": {"sql": "select count(*) from pet where age > 3", "rows": [[4]], "turns": 1},
            "reward": {"score": 1.0, "components": {"parses": 1, "executes": 1, "matches": 1}, "feedback": "correct"},
            "tokens": 74,
            "duration": 0.06,
        }
    )
    ids = [s[0] for s in systems]
    gen_of = {s[0]: s[3] for s in systems}
    quality = dict.fromkeys(ids, 0.3) | {a[0]: a[1] for a in accepted}
    rows, data = [], []
    for i in range(n_traj):
        sid = ids[i // max(1, n_traj // len(ids)) % len(ids)]
        task = f"val-{i % VAL_TASKS}"
        score = float(rnd.random() < quality[sid])
        rows.append(
            (
                i + 1,
                f"eval:val/{sid}/{task}/{i}",
                "val",
                "eval",
                gen_of[sid],
                sid,
                task,
                i // (len(ids) * VAL_TASKS),
                score,
                0,
                0,
                74,
                0.0,
                now + gen_of[sid],
                1,
                0.06,
            )
        )
        data.append((i + 1, 0, template.replace("TASK", task).replace("SID", sid).encode()))
        if len(rows) == 50_000:
            db.executemany("INSERT INTO trajectories VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            db.executemany("INSERT INTO trajectory_data VALUES (?, ?, ?)", data)
            rows, data = [], []
    if rows:
        db.executemany("INSERT INTO trajectories VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.executemany("INSERT INTO trajectory_data VALUES (?, ?, ?)", data)
    gen_rows = []
    for g in range(gens + 1):
        upto = [a for a in accepted if a[2] <= g]
        top = max(upto, key=lambda a: a[1])
        gen_rows.append(
            {
                "index": g,
                "best_val": round(top[1], 4),
                "best": top[0],
                "children": per_gen if g else 0,
                "accepted": sum(1 for a in accepted if a[2] == g),
                "rollouts": n_traj // (gens + 1),
                "calls": n_traj // (gens + 1),
                "tokens": 74 * n_traj // (gens + 1),
                "seconds": 60.0,
            }
        )
    task = {"name": "synthetic", "seed": seed, "budget": {"generations": gens}, "operators": [{"name": "x"}]}
    for key, value in (
        ("task", json.dumps(task)),
        ("baseline", base),
        ("best", best[1]),
        ("generations", gen_rows),
        ("accepted", [{"system_id": s, "score": sc, "generation": g} for s, sc, g in accepted]),
        ("elapsed", 6060.0),
    ):
        db.execute("INSERT OR REPLACE INTO state VALUES (?, ?, ?)", (key, json.dumps(value), now))
    db.execute("INSERT INTO pointer (system_id, reason, created_at) VALUES (?, 'promote', ?)", (best[1], now))
    db.execute("COMMIT")
    db.close()
    (run / "report.json").write_text(json.dumps({"task": "synthetic", "stop_reason": "generations done"}))


def get(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def memory(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--systems", type=int, default=10_000)
    ap.add_argument("--trajectories", type=int, default=1_000_000)
    ap.add_argument("--out", type=Path, default=Path("/tmp/evolve-ui-bench"))
    ap.add_argument("--browser", action="store_true")
    a = ap.parse_args()
    run = a.out / f"synthetic-{a.systems}-{a.trajectories}"
    if not (run / "report.json").exists():
        t0 = time.perf_counter()
        build(run, a.systems, a.trajectories)
        print(
            f"built {run} in {time.perf_counter() - t0:.0f} s "
            f"({(run / 'archive.sqlite').stat().st_size / 2**20:.0f} MiB)",
            flush=True,
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t_start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolve", "ui", str(run), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results: dict[str, dict[str, float]] = {}
    try:
        proc.stdout.readline()
        base = f"http://127.0.0.1:{port}"
        results["server start (to listening)"] = {"s": time.perf_counter() - t_start}
        results["server memory at start (MiB)"] = memory(proc.pid)
        rid = run.name
        views = [
            ("first page: / and /api/runs", ["/", "/static/js/main.js", "/api/runs"]),
            ("run overview: summary and curves", [f"/api/runs/{rid}/summary"]),
            ("lineage (collapsed)", [f"/api/runs/{rid}/lineage"]),
            ("system panel (best)", [f"/api/runs/{rid}/systems/best"]),
            ("its rollouts, first page", [f"/api/runs/{rid}/systems/best/rollouts?limit=25"]),
            ("one trajectory", [f"/api/runs/{rid}/rollouts/{a.trajectories // 2}"]),
            ("task matrix (val)", [f"/api/runs/{rid}/matrix"]),
            ("poll: version", [f"/api/runs/{rid}/version"]),
        ]
        for name, urls in views:
            cold = sum(get(base + u)[0] for u in urls)
            warm = sum(get(base + u)[0] for u in urls)
            results[name] = {"cold_s": cold, "warm_s": warm}
        with urllib.request.urlopen(f"{base}/api/runs/{rid}/lineage", timeout=120) as r:
            pic = json.loads(r.read())
        results["lineage drawn"] = {"nodes": pic["shown"], "of": pic["total"], "view": pic["view"]}
        with urllib.request.urlopen(f"{base}/api/runs/{rid}/lineage?view=all", timeout=300) as r:
            t0 = time.perf_counter()
            whole = json.loads(r.read())
        results["lineage whole (JSON)"] = {"nodes": len(whole["nodes"]), "kb": len(json.dumps(whole)) / 1024}
        if a.browser:
            try:
                results.update(browser(base, rid))
            except Exception as e:  # noqa: BLE001 - say what failed, keep the server-side figures
                results["browser"] = {"failed": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
        results["server memory at the end (MiB)"] = memory(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(json.dumps(results, indent=1))


def browser(base: str, rid: str) -> dict[str, dict[str, float]]:
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright

    from tests.helpers.browser import launch

    out = {}
    with sync_playwright() as p:
        b = launch(p)
        pg = b.new_page(viewport={"width": 1400, "height": 900})
        t0 = time.perf_counter()
        pg.goto(f"{base}/#/")
        pg.wait_for_selector("#runs tbody tr", timeout=120_000)
        out["browser: first page drawn"] = {"s": time.perf_counter() - t0}
        pg.wait_for_timeout(5000)  # a reader looks at the list (the page fetches Plotly meanwhile)
        t0 = time.perf_counter()
        pg.click(f'#runs a[href="#/run/{rid}"]')
        pg.wait_for_selector("#plot-scores .main-svg", timeout=120_000)
        out["browser: click the run, overview and curves drawn"] = {"s": time.perf_counter() - t0}
        t0 = time.perf_counter()
        pg.click('.tabs a[data-tab="lineage"]')
        pg.wait_for_selector("#system-panel h2", timeout=120_000)
        out["browser: lineage tab and panel drawn"] = {
            "s": time.perf_counter() - t0,
            "svg_nodes": pg.locator("svg#lineage g.node").count(),
        }
        t0 = time.perf_counter()
        node = pg.locator("svg#lineage g.node").nth(5)
        sid = node.get_attribute("data-id")
        node.click()
        pg.wait_for_selector(f'#system-panel [data-system="{sid}"]', timeout=120_000)
        out["browser: click a node, its panel drawn"] = {"s": time.perf_counter() - t0}
        t0 = time.perf_counter()
        pg.click("#lineage-toolbar-accepted")
        pg.locator("#lineage-note", has_text="accepted and marked").wait_for(timeout=120_000)  # (CSP: no eval)
        out["browser: draw the accepted systems"] = {
            "s": time.perf_counter() - t0,
            "svg_nodes": pg.locator("svg#lineage g.node").count(),
        }
        pg.screenshot(path="/tmp/evolve-ui-bench-lineage.png")
        b.close()
    return out


if __name__ == "__main__":
    main()

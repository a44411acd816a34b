"""What a tracker costs a run: the toy run (tests/data/toy.yaml, scripted model with a delay per
call) with no tracker, and with each of otel (a real OTLP/gRPC receiver on loopback), wandb
(offline) and mlflow (a real MLflow server on loopback, sqlite backend), each run in a fresh process.

    python bench/infra/trackers_overhead.py [--repeats 3] [--delay 0.01] [--generations 4]

Per tracker: the run's wall time, the part of it spent waiting at the end for the trackers' last
sends (Tracking.close), the rest (the run itself), and the time `evolve track` takes to send the
finished run afterwards to a fresh destination.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys, time
import yaml
import evolve
from evolve.trackers import live

spent = {"close": 0.0}
close = live.Tracking.close
def timed(self, status):
    t = time.perf_counter()
    close(self, status)
    spent["close"] += time.perf_counter() - t
live.Tracking.close = timed

task = yaml.safe_load(open(sys.argv[1]))
t0 = time.perf_counter()
evolve.run(task, out=sys.argv[2])
total = time.perf_counter() - t0
t1 = time.perf_counter()
args = json.loads(sys.argv[3])
if args:
    from evolve.cli.commands import main
    try:
        main(["track", sys.argv[2], *args])
    except SystemExit as e:
        assert not e.code, e.code
after = time.perf_counter() - t1 if args else None
print(json.dumps({"total": total, "close": spent["close"], "after": after}))
"""


def start_mlflow(root: Path) -> tuple[subprocess.Popen, str]:
    from tests.helpers.upstream import free_port

    port = free_port()
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while time.time() - t0 < 300:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                print(f"mlflow server up after {time.time() - t0:.1f} s", flush=True)
                return proc, url
        except OSError:
            time.sleep(0.25)
    raise SystemExit("the MLflow server did not start")


def main() -> int:
    import yaml

    from tests.helpers.otlp import Collector

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delay", type=float, default=0.01, help="seconds per scripted model call")
    ap.add_argument("--generations", type=int, default=4)
    a = ap.parse_args()
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_SILENT": "true",
        "WANDB_MODE": "offline",
    }
    with tempfile.TemporaryDirectory() as d, Collector() as col:
        tmp = Path(d)
        for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            env[var] = str(tmp / "wandb-home" / var)
        (tmp / "mlflow").mkdir()
        server, url = start_mlflow(tmp / "mlflow")
        try:
            trackers = {
                "none": ([], []),
                "otel": (
                    [{"name": "otel", "params": {"endpoint": col.endpoint}}],
                    ["--to", "otel", "--param", f"endpoint={col.endpoint}", "--param", "service=again"],
                ),
                "wandb (offline)": (
                    [{"name": "wandb", "params": {"mode": "offline"}}],
                    ["--to", "wandb", "--param", "mode=offline", "--param", "project=again"],
                ),
                "mlflow": (
                    [{"name": "mlflow", "params": {"tracking_uri": url}}],
                    ["--to", "mlflow", "--param", f"tracking_uri={url}", "--param", "experiment=again"],
                ),
            }
            task = yaml.safe_load((ROOT / "tests" / "data" / "toy.yaml").read_text())
            task["budget"] = {"generations": a.generations}
            task["models"]["policy"]["params"]["delay"] = a.delay
            rows = []
            for name, (track, after) in trackers.items():
                got = []
                for i in range(a.repeats):
                    f = tmp / f"task-{len(rows)}-{i}.yaml"
                    f.write_text(yaml.safe_dump({**task, "track": track}))
                    r = subprocess.run(
                        [sys.executable, "-c", CHILD, str(f), str(tmp / f"run-{len(rows)}-{i}"), json.dumps(after)],
                        cwd=tmp,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=900,
                    )
                    if r.returncode:
                        raise SystemExit(f"{name}: {r.stderr[-2000:]}")
                    got.append(json.loads(r.stdout.strip().splitlines()[-1]))
                med = {
                    k: statistics.median(g[k] for g in got) if got[0][k] is not None else None
                    for k in ("total", "close", "after")
                }
                rows.append((name, med))
                print(
                    f"{name:16} run {med['total']:6.2f} s   waiting for the trackers at the end {med['close']:5.2f} s   "
                    f"the run itself {med['total'] - med['close']:6.2f} s   evolve track afterwards "
                    + (f"{med['after']:5.2f} s" if med["after"] is not None else "—"),
                    flush=True,
                )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What `evolve gateway` adds per call: the same scripted upstream called directly and through the
gateway, p50 / p95 latency over N calls, whole answers and streams, one client and 8 at once.

    python bench/serving/gateway_overhead.py [--calls 300] [--latency-ms 0 50]

The upstream (tests/helpers/upstream.py: a starlette server answering OpenAI chat completions,
`slow-<ms>` waiting that long first) and the gateway (`python -m evolve gateway`, trace store in a
temporary folder) each run in a process of their own; the client is the `openai` SDK with
keep-alive. A call's latency is the time to its last byte.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.upstream import free_port  # noqa: E402

UPSTREAM = """
import sys, time, signal
from tests.helpers.upstream import ScriptedUpstream
up = ScriptedUpstream(); up.port = int(sys.argv[1]); up.url = f"http://127.0.0.1:{up.port}/v1"
with up:
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
"""


def wait(url: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a server exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def measure(base: str, model: str, calls: int, concurrency: int, stream: bool) -> list[float]:
    import openai

    times: list[float] = []
    lock = threading.Lock()
    per = calls // concurrency

    def worker(i: int) -> None:
        client = openai.OpenAI(
            base_url=base, api_key="unused", max_retries=0, default_headers={"X-Evolve-Session": f"bench-{i}"}
        )
        for n in range(per):
            msgs = [{"role": "user", "content": f"question {i} {n} about the weather today"}]
            t0 = time.perf_counter()
            if stream:
                for _ in client.chat.completions.create(model=model, messages=msgs, stream=True):
                    pass
            else:
                client.chat.completions.create(model=model, messages=msgs)
            with lock:
                times.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--latency-ms", type=int, nargs="+", default=[0, 50])
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    up_port, gw_port = free_port(), free_port()
    store = tempfile.mkdtemp(prefix="gw-bench-")
    up = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM, str(up_port)],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    gw = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "evolve",
            "gateway",
            "--upstream",
            "openai/*",
            "--api-base",
            f"http://127.0.0.1:{up_port}/v1",
            "--store",
            store,
            "--port",
            str(gw_port),
        ],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait(f"http://127.0.0.1:{up_port}/v1/models", up)
        wait(f"http://127.0.0.1:{gw_port}/healthz", gw)
        direct, via = f"http://127.0.0.1:{up_port}/v1", f"http://127.0.0.1:{gw_port}/v1"
        measure(via, "warm", 8, 1, False)
        measure(direct, "warm", 8, 1, False)
        print(
            f"# {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{args.calls} calls per cell, {time.strftime('%Y-%m-%d')}"
        )
        print("| upstream latency | mode | clients | direct p50 / p95 ms | gateway p50 / p95 ms | added p50 / p95 ms |")
        print("|---|---|---|---|---|---|")
        for ms in args.latency_ms:
            model = f"slow-{ms}" if ms else "fast"
            for stream in (False, True):
                for conc in (1, 8):
                    d = measure(direct, model, args.calls, conc, stream)
                    g = measure(via, model, args.calls, conc, stream)
                    print(
                        f"| {ms} ms | {'stream' if stream else 'whole'} | {conc} | {pct(d, 0.5):.1f} / {pct(d, 0.95):.1f}"
                        f" | {pct(g, 0.5):.1f} / {pct(g, 0.95):.1f} | {pct(g, 0.5) - pct(d, 0.5):+.1f} / "
                        f"{pct(g, 0.95) - pct(d, 0.95):+.1f} |",
                        flush=True,
                    )
        from evolve.gateway import TraceStore

        st = TraceStore(store, create=False)
        print(f"# trace store: {st.counts()}, integrity problems: {len(st.integrity())}")
    finally:
        for p in (gw, up):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()

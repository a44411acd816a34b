"""kill -9 during a promotion and during a canary: after a restart the deployment is exactly
before or after each decision, never between, and the audit trail is whole."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from evolve.archive import Archive
from evolve.deploy import Deployment
from evolve.deploy.manage import promote
from tests.evolve.test_deploy import POLICY, _candidate, _forget_module, _setup  # noqa: F401
from tests.evolve.test_deploy_canary import CANARY
from tests.evolve.test_gateway_cli import _wait_port
from tests.helpers import ROOT
from tests.helpers.upstream import ScriptedUpstream, free_port, post

pytestmark = pytest.mark.slow


def _consistent(run) -> dict[str, str]:
    with Archive(run, create=False) as a:
        dep = Deployment(a)
        assert dep.check() == []
        return dep.states()


def test_kill_9_during_a_promotion_leaves_it_before_or_after(tmp_path):
    task, run, base = _setup(tmp_path, POLICY)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    rng = random.Random(0)
    outcomes = []
    for trial in range(5):
        cand = _candidate(run, base, skill="8", delay="0.1", trial=str(trial))
        before = _consistent(run)
        proc = subprocess.Popen(
            [sys.executable, "-m", "evolve", "promote", str(task), str(run), "--system", cand],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        time.sleep(rng.uniform(1.0, 5.0))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        after = _consistent(run)
        moves = [e["to"] for e in Deployment(Archive(run, create=False)).events(cand)]
        if moves:  # the decision was made: all of it
            assert moves == ["proposed", "gated", "active"] and after[cand] == "active"
            outcomes.append("after")
            base = cand  # the next candidate is compared with the new active system
        else:
            assert after == before and cand not in after
            outcomes.append("before")
    assert "before" in outcomes  # some kills landed inside the gates
    # a killed promotion is simply run again: the finished rollouts are reused
    last = next(c for c in [_candidate(run, base, skill="9")])
    assert promote(task, run, system=last)["state"] == "active"
    assert _consistent(run)[last] == "active"


def test_kill_9_of_the_gateway_during_a_canary_keeps_one_decision_and_a_whole_trail(tmp_path):
    task, run, base = _setup(tmp_path, CANARY)
    good = _candidate(run, base, skill="8")
    assert promote(task, run, system=good)["state"] == "canary"
    rng = random.Random(1)
    with ScriptedUpstream() as up:
        cfg = {
            "port": free_port(),
            "store": str(tmp_path / "traces"),
            "routes": [
                {
                    "upstream": {"model": "openai/*", "api_base": up.url},
                    "evolve": {"run": str(run), "poll": 0.05, "apply": [{"component": "skill", "how": "prepend"}]},
                }
            ],
        }
        (tmp_path / "gw.yaml").write_text(json.dumps(cfg))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        kills, n = 0, 0
        while kills < 6:
            proc = subprocess.Popen(
                [sys.executable, "-m", "evolve", "gateway", str(tmp_path / "gw.yaml")],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
            try:
                _wait_port(cfg["port"], proc)
                stop = threading.Event()

                def users(k: int, stop: threading.Event = stop) -> None:
                    nonlocal n
                    while not stop.is_set():
                        n += 1
                        sid = f"u{k}-{n}"
                        try:
                            st, r = post(
                                f"http://127.0.0.1:{cfg['port']}/v1/chat/completions",
                                {"model": "m", "messages": [{"role": "user", "content": "q"}]},
                                {"x-evolve-session": sid},
                            )
                            rate = 0.95 if r.get("system_fingerprint") == good else 0.5
                            post(
                                f"http://127.0.0.1:{cfg['port']}/v1/feedback",
                                {"session_id": sid, "score": float(rng.random() < rate)},
                            )
                        except OSError:
                            return

                threads = [threading.Thread(target=users, args=(k,)) for k in range(4)]
                for t in threads:
                    t.start()
                time.sleep(rng.uniform(0.5, 2.5))
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                stop.set()
                for t in threads:
                    t.join(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
            kills += 1
            states = _consistent(run)
            with Archive(run, create=False) as a:
                can = a.get_state("deploy.canary")
            assert (can is not None) == (states[good] == "canary")  # the canary and the trail agree
            if states[good] != "canary":
                break
    with Archive(run, create=False) as a:
        moves = [e["to"] for e in Deployment(a).events(good)]
        decided = moves[-1]
    assert moves[:3] == ["proposed", "gated", "canary"] and len(moves) <= 4  # at most one decision, never two
    assert decided in ("canary", "active")

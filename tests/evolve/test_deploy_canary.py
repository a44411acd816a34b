"""The canary on live traffic through the gateway: a share of new sessions is served by the
candidate, sticky per session; the users' feedback decides, by a test valid at every check, to
promote it or to stop it and roll back; a rolled-back system serves no one after."""

from __future__ import annotations

import random
import time

import pytest

from evolve.archive import Archive
from evolve.deploy import Deployment
from evolve.deploy.canary import decide, in_canary, radius
from evolve.deploy.manage import promote, status
from tests.helpers.upstream import ScriptedUpstream
from tests.evolve.test_deploy import POLICY, _candidate, _forget_module, _setup  # noqa: F401

pytest.importorskip("starlette")

CANARY = {**POLICY, "canary": {"share": 0.5, "min_sessions": 20, "max_sessions": 400, "margin": 0.05}}


def test_the_sequential_test_promotes_stops_or_waits_and_its_error_rate_holds_under_peeking():
    cfg = {"alpha": 0.05, "margin": 0.02, "min_sessions": 50, "max_sessions": 2000, "max_hours": 72}
    assert decide([1.0] * 60, [0.5, 0.5] * 100, cfg, started=0, now=1)[0] == "promote"
    assert decide([0.0] * 60, [1.0] * 200, cfg, started=0, now=1)[0] == "stop"
    assert decide([1.0] * 10, [0.5] * 200, cfg, started=0, now=1)[0] == "wait"  # too few yet
    assert decide([0.5] * 10, [0.5] * 200, cfg, started=0, now=73 * 3600)[0] == "expire"
    assert radius(100, 0.05, 50) < radius(50, 0.05, 50) < radius(10, 0.05, 50)
    # two equal arms, the test checked after every session: it must stop a candidate that is not
    # worse in (far) fewer than alpha of the runs
    rng = random.Random(0)
    stopped = 0
    for _ in range(200):
        c, a = [], []
        for _ in range(400):
            (c if rng.random() < 0.5 else a).append(float(rng.random() < 0.6))
            if c and a and decide(c, a, cfg, started=0, now=1)[0] == "stop":
                stopped += 1
                break
    assert stopped <= 0.05 * 200


def test_sessions_are_split_by_a_hash_sticky_and_near_the_share():
    can = {"salt": "s", "share": 0.1}
    got = [in_canary(f"user-{i}", can) for i in range(5000)]
    assert 0.08 < sum(got) / len(got) < 0.12 and got == [in_canary(f"user-{i}", can) for i in range(5000)]


def _serve(gw, run, rates: dict[str, float], n: int, seed: int = 0, until_decided: bool = True) -> list[str]:
    """n new sessions through the gateway; each user's feedback is 1 with the rate of the system
    that answered (by the response's system fingerprint). Returns the answering systems."""
    import openai

    from tests.helpers.upstream import post

    client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
    rng = random.Random(seed)
    served = []
    for i in range(n):
        sid = f"user-{seed}-{i}"
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "how many?"}],
                                           extra_headers={"X-Evolve-Session": sid})
        served.append(r.system_fingerprint)
        score = float(rng.random() < rates[r.system_fingerprint])
        assert post(f"{gw.url}/feedback", {"session_id": sid, "score": score})[0] == 201
        with Archive(run, create=False) as a:
            if until_decided and a.get_state("deploy.canary") is None:
                break
    return served


def _gateway(run, tmp_path, up):
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import GatewayConfig

    cfg = GatewayConfig.model_validate({"port": 0, "store": tmp_path / "traces", "routes": [
        {"upstream": {"model": "openai/*", "api_base": up.url}, "evolve": {
            "run": run, "poll": 0.05, "apply": [{"component": "skill", "how": "prepend"}]}}]})
    return GatewayServer(cfg)


def test_a_candidate_better_on_live_traffic_is_promoted_by_the_canary(tmp_path):
    task, run, base = _setup(tmp_path, CANARY)
    good = _candidate(run, base, skill="8")
    res = promote(task, run, system=good)
    assert res["state"] == "canary" and "serves 50% of new sessions" in res["message"]
    with ScriptedUpstream() as up, _gateway(run, tmp_path, up) as gw:
        served = _serve(gw, run, {base: 0.5, good: 0.95}, 400)
        assert good in served and base in served
        time.sleep(0.2)
        after = _serve(gw, run, {base: 0.5, good: 0.95}, 5, seed=1, until_decided=False)
        st = status(run, traces=tmp_path / "traces")
    assert st["active"] == good and st["canary"] is None and after == [good] * 5  # new sessions: the new system
    (decision,) = [e for e in st["trail"] if e["by"] == "canary" and e["system"] == good]
    assert decision["to"] == "active" and decision["evidence"]["candidate_sessions"] >= 20
    assert decision["evidence"]["lower"] >= -0.05 and st["problems"] == []


def test_a_candidate_that_passed_the_gates_but_is_worse_live_is_stopped_and_rolled_back(tmp_path):
    task, run, base = _setup(tmp_path, CANARY)
    sly = _candidate(run, base, skill="8")  # better on the suites ...
    assert promote(task, run, system=sly)["state"] == "canary"
    with ScriptedUpstream() as up, _gateway(run, tmp_path, up) as gw:
        served = _serve(gw, run, {base: 0.7, sly: 0.1}, 400)  # ... but the users dislike it
        n_sly = served.count(sly)
        time.sleep(0.2)
        import openai

        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        pinned = next(f"user-0-{i}" for i, s in enumerate(served) if s == sly)
        again = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "and now?"}],
                                               extra_headers={"X-Evolve-Session": pinned})
    with Archive(run, create=False) as a:
        dep = Deployment(a)
        assert a.current() == base and dep.state(sly) == "rolled_back" and sly in dep.blocked()
        (decision,) = [e for e in dep.events(sly) if e["by"] == "canary"]
    assert decision["evidence"]["upper"] < 0 and n_sly < 100  # stopped early, well before max_sessions
    assert again.system_fingerprint == base  # a session pinned to it is served by the active system now

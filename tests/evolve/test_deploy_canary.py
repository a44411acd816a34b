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
from tests.evolve.test_deploy import POLICY, _candidate, _forget_module, _setup  # noqa: F401
from tests.helpers.upstream import ScriptedUpstream

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
        r = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "how many?"}], extra_headers={"X-Evolve-Session": sid}
        )
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

    cfg = GatewayConfig.model_validate(
        {
            "port": 0,
            "store": tmp_path / "traces",
            "routes": [
                {
                    "upstream": {"model": "openai/*", "api_base": up.url},
                    "evolve": {"run": run, "poll": 0.05, "apply": [{"component": "skill", "how": "prepend"}]},
                }
            ],
        }
    )
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
        again = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "and now?"}], extra_headers={"X-Evolve-Session": pinned}
        )
    with Archive(run, create=False) as a:
        dep = Deployment(a)
        assert a.current() == base and dep.state(sly) == "rolled_back" and sly in dep.blocked()
        (decision,) = [e for e in dep.events(sly) if e["by"] == "canary"]
    assert decision["evidence"]["upper"] < 0 and n_sly < 100  # stopped early, well before max_sessions
    assert again.system_fingerprint == base  # a session pinned to it is served by the active system now


def _arms(run, n_cand: int, n_act: int, prefix: str) -> tuple[list[str], list[str]]:
    """Session ids the canary under way sends to the candidate (n_cand) and to the active system (n_act)."""
    with Archive(run, create=False) as a:
        can = a.get_state("deploy.canary")
    ids = (f"{prefix}-{i}" for i in range(10_000))
    cand, act = [], []
    for sid in ids:
        (cand if in_canary(sid, can) else act).append(sid)
        if len(cand) >= n_cand and len(act) >= n_act:
            return cand[:n_cand], act[:n_act]
    raise AssertionError("the hash split nothing")


def _call(gw, sid: str) -> str:
    """One call of session ``sid`` through the gateway: the system that answered."""
    import openai

    client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "how many?"}], extra_headers={"X-Evolve-Session": sid}
    )
    return r.system_fingerprint


def _bad_burst(gw, run, base: str, sly: str) -> tuple[float, float]:
    """45 sessions, then a burst of feedback: the active system's users all pleased, the candidate's
    none; the evidence says stop only at the burst's last feedback. Returns when the burst began
    and ended (time.monotonic)."""
    from tests.helpers.upstream import post

    cand, act = _arms(run, 15, 30, "burst")
    assert [_call(gw, s) for s in cand] == [sly] * 15 and [_call(gw, s) for s in act] == [base] * 30
    t0 = time.monotonic()
    for sid, score in [*((s, 1.0) for s in act), *((s, 0.0) for s in cand)]:
        assert post(f"{gw.url}/feedback", {"session_id": sid, "score": score})[0] == 201
    return t0, time.monotonic()


def test_after_a_burst_of_bad_feedback_the_next_new_session_is_not_sent_to_the_candidate(tmp_path):
    task, run, base = _setup(tmp_path, CANARY)
    sly = _candidate(run, base, skill="8")
    assert promote(task, run, system=sly)["state"] == "canary"
    with ScriptedUpstream() as up, _gateway(run, tmp_path, up) as gw:
        gw.gateway.routes[0].canary.every = 3600  # only the burst's first feedback is tested on arrival
        _bad_burst(gw, run, base, sly)
        assert status(run, traces=tmp_path / "traces")["canary_test"]["decision"] == "stop"
        (nxt,), _ = _arms(run, 1, 0, "next")  # a new session the split would send to the candidate
        assert _call(gw, nxt) == base  # no more feedback came: the split itself tested the burst
    st = status(run, traces=tmp_path / "traces")
    assert st["active"] == base and st["canary"] is None and st["states"][sly] == "rolled_back"
    (decision,) = [e for e in st["trail"] if e["by"] == "canary"]
    assert decision["evidence"]["candidate_sessions"] == 15 and decision["evidence"]["upper"] < 0


def test_a_test_skipped_by_the_throttle_is_made_up_without_more_feedback(tmp_path):
    task, run, base = _setup(tmp_path, CANARY)
    sly = _candidate(run, base, skill="8")
    assert promote(task, run, system=sly)["state"] == "canary"
    every = 1.0
    with ScriptedUpstream() as up, _gateway(run, tmp_path, up) as gw:
        gw.gateway.routes[0].canary.every = every
        t0, t1 = _bad_burst(gw, run, base, sly)  # its first feedback is tested at once, the others throttled
        with Archive(run, create=False) as a:
            undecided = a.get_state("deploy.canary") is not None
        decided = None
        while decided is None and time.monotonic() < t0 + every + 10:  # no feedback, no session: only waiting
            time.sleep(0.1)
            with Archive(run, create=False) as a:
                decided = Deployment(a).state(sly) if a.get_state("deploy.canary") is None else None
        waited = time.monotonic() - t0
    assert t1 - t0 < every and undecided  # the decisive feedback came while the test was throttled ...
    assert decided == "rolled_back" and waited < every + 5  # ... and was tested once the throttle allowed


def test_a_canary_past_max_hours_without_feedback_ends_undecided_and_serves_no_new_session(tmp_path, monkeypatch):
    import types

    import evolve.deploy.canary as canary_mod

    task, run, base = _setup(tmp_path, CANARY)
    cand = _candidate(run, base, skill="8")
    assert promote(task, run, system=cand)["state"] == "canary"
    with ScriptedUpstream() as up, _gateway(run, tmp_path, up) as gw:
        before = [_call(gw, f"early-{i}") for i in range(10)]
        assert cand in before  # within max_hours: its share of new sessions
        later = time.time() + 73 * 3600  # max_hours is 72; no feedback at all
        monkeypatch.setattr(canary_mod, "time", types.SimpleNamespace(time=lambda: later, monotonic=time.monotonic))
        after = [_call(gw, f"late-{i}") for i in range(20)]
        st = status(run, traces=tmp_path / "traces")
    assert after == [base] * 20
    assert st["active"] == base and st["canary"] is None and st["states"][cand] == "rolled_back"
    (end,) = [e for e in st["trail"] if e["by"] == "canary"]
    assert "undecided after 73.0 h and 0 scored candidate sessions" in end["why"] and "not promoted" in end["why"]


def test_an_expired_canary_ends_when_consulted_even_without_a_trace_store(tmp_path, monkeypatch):
    import types

    import evolve.deploy.canary as canary_mod
    from evolve.deploy.canary import end_expired

    task, run, base = _setup(tmp_path, CANARY)
    cand = _candidate(run, base, skill="8")
    assert promote(task, run, system=cand)["state"] == "canary"
    assert status(run)["canary_expired"] is False
    with Archive(run, create=False) as a:
        assert end_expired(a) is None  # time left: nothing happens
        later = time.time() + 72 * 3600 + 60
        monkeypatch.setattr(canary_mod, "time", types.SimpleNamespace(time=lambda: later, monotonic=time.monotonic))
        st = status(run)  # it says so, and only reads: the canary is still there for a call to end
        assert st["canary_expired"] is True and st["canary"]["system"] == cand
        got = end_expired(a)
        dep = Deployment(a)
        assert got["decision"] == "expire" and dep.canary() is None and dep.state(cand) == "rolled_back"
        assert a.current() == base and cand in dep.blocked()
        assert end_expired(a) is None  # ended once

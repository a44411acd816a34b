"""A team behind one gateway: an unmodified app whose graph calls two model names (a writer node
and a reviewer node) gets each name answered by its own role of the run's system, each call
recorded under its role, the traces learned role by role, and after a promotion each name served
its own adapter."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("starlette")

QUESTIONS = [f"topic {i}" for i in range(6)]


def _team_run(d):
    """A run whose systems have two roles on one tiny base: ``before`` (no adapters, current) and
    ``after`` (the writer with a LoRA adapter, the reviewer as before)."""
    from evolve.archive import Archive
    from evolve.types import ModelSpec, System
    from tests.helpers import tiny_base_and_adapter

    tiny_base_and_adapter(d)
    with Archive(d / "run") as archive:
        base = archive.artifacts.put_file(d / "base.st", "base_weights")
        ad = archive.artifacts.put_file(d / "adapter.st", "adapter")
        params = {"temperature": 0.0, "max_tokens": 8, "batch_wait_ms": 1, "max_wait_ms": 5}
        plain = ModelSpec(name="tiny", base=base, params=params)
        before = System(models={"writer": plain, "reviewer": plain})
        after = System(models={"writer": plain.model_copy(update={"adapter": ad}), "reviewer": plain})
        archive.add_system(before)
        archive.add_system(after, parents=[before.id], operator="from_traces")
        archive.set_current(before.id)
    return d / "run", before, after


@pytest.fixture(scope="module")
def team_run(tmp_path_factory):
    return _team_run(tmp_path_factory.mktemp("gw-team"))


def _graph(base_url: str):
    """The app: a two-node LangGraph graph (writer, then reviewer), each node a ChatOpenAI of its
    own model name pointed at the gateway; without LangGraph, the same two calls with openai."""
    try:
        from langchain_openai import ChatOpenAI
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        import openai

        def run(q: str) -> dict:
            client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

            def ask(model: str, text: str) -> str | None:
                messages = [{"role": "user", "content": text}]
                reply = client.chat.completions.create(model=model, messages=messages, temperature=0.0, max_tokens=8)
                return reply.choices[0].message.content

            draft = ask("writer-model", q)
            return {"q": q, "draft": draft, "review": ask("reviewer", f"review: {draft}")}

        return run
    from typing import TypedDict

    class State(TypedDict, total=False):
        q: str
        draft: str
        review: str

    kw = dict(base_url=base_url, api_key="unused", temperature=0.0, max_tokens=8, max_retries=0)
    writer, reviewer = ChatOpenAI(model="writer-model", **kw), ChatOpenAI(model="reviewer", **kw)
    g = StateGraph(State)
    g.add_node("write", lambda s: {"draft": writer.invoke(s["q"]).content})
    g.add_node("review", lambda s: {"review": reviewer.invoke(f"review: {s['draft']}").content})
    g.add_edge(START, "write")
    g.add_edge("write", "review")
    g.add_edge("review", END)
    app = g.compile()
    return lambda q: app.invoke({"q": q})


def test_a_two_name_app_is_recorded_and_learned_role_by_role_and_served_each_roles_adapter(team_run, tmp_path):
    from evolve.archive import Archive
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import GatewayConfig, LocalConfig, RouteConfig
    from evolve.gateway.dataset import sessions
    from evolve.policy.from_traces import FromTraces
    from evolve.policy.local import build
    from evolve.types import Message

    path, before, after = team_run
    # the model names the app sends -> the system's roles ("reviewer" by default: name = role)
    cfg = GatewayConfig(
        port=0,
        store=tmp_path / "traces",
        routes=[
            RouteConfig(
                name="team",
                local=LocalConfig(run=path, roles={"writer-model": "writer", "reviewer": "reviewer"}, poll=0.05),
            )
        ],
    )
    with GatewayServer(cfg) as gw:
        route = gw.gateway.routes[0]
        assert sorted(route.names()) == ["reviewer", "writer-model"]
        ups = route.upstream.ups
        assert ups["writer"]._app._handle.llm.server is ups["reviewer"]._app._handle.llm.server  # one base
        for i, q in enumerate(QUESTIONS):
            out = _graph(f"{gw.base}/s/team-{i}/v1")(q)
            assert out["draft"] is not None and out["review"] is not None
            gw.gateway.store.feedback(
                session_id=f"team-{i}", score=1.0 if i % 3 else 0.0, components={"reviewer": 0.0} if i == 1 else None
            )
        store = gw.gateway.store
        for i in range(len(QUESTIONS)):
            calls = store.calls(f"team-{i}")
            assert [c.model for c in calls] == ["writer-model", "reviewer"]
            assert [c.params["served_by"]["role"] for c in calls] == ["writer", "reviewer"]
            assert all(c.system_id == before.id and c.token_ids for c in calls)

        # each role's data holds only that role's calls
        every = sessions(str(tmp_path / "traces"), val=0.0)["train"]
        assert len(every) == len(QUESTIONS)
        assert all([c["role"] for c in t["calls"]] == ["writer", "reviewer"] for t in every)
        writer_tasks = sessions(str(tmp_path / "traces"), val=0.0, role="writer")["train"]
        assert all([c["role"] for c in t["calls"]] == ["writer"] for t in writer_tasks)
        sha = before.models["writer"].base.sha256
        ok = {f"team-{i}" for i in range(len(QUESTIONS)) if i % 3}
        want = {
            r: [
                (tuple(c.prompt_token_ids), tuple(c.token_ids))
                for s in sorted(ok)
                for c in store.calls(s)
                if c.params["served_by"]["role"] == r
            ]
            for r in ("writer", "reviewer")
        }
        op = FromTraces(roles=["writer", "reviewer"], min_score=1.0)
        got_w, counts_w = op.examples(every, sha, "writer")
        assert sorted(got_w) == sorted(set(want["writer"])) and counts_w["other_role"] == len(QUESTIONS)
        assert not set(got_w) & (set(want["reviewer"]) - set(want["writer"]))  # no reviewer call in it
        got_r, _ = op.examples(every, sha, "reviewer")  # team-1's feedback scored its reviewer 0
        reviewer_ok = [
            (tuple(c.prompt_token_ids), tuple(c.token_ids))
            for s in sorted(ok - {"team-1"})
            for c in store.calls(s)
            if c.params["served_by"]["role"] == "reviewer"
        ]
        assert sorted(got_r) == sorted(set(reviewer_ok))
        # the single-role setting on a team's traffic also keeps to its role
        single, _ = FromTraces(role="writer", min_score=1.0).examples(every, sha, "writer")
        assert sorted(single) == sorted(got_w)

        # the promoted system: each name answered by its own role's adapter
        with Archive(path, create=False) as archive:
            archive.set_current(after.id)
            direct = {}
            for role in ("writer", "reviewer"):
                for s in (before, after):
                    llm = build(s.models[role], archive.artifacts)
                    direct[role, s.id] = llm.complete(
                        [Message(role="user", content="fresh topic")], temperature=0.0, max_tokens=8
                    ).text
                    llm.close()
        deadline = time.time() + 30
        while any(up.system_id != after.id for up in ups.values()) and time.time() < deadline:
            time.sleep(0.05)
        out = _graph(f"{gw.base}/s/after-promotion/v1")("fresh topic")
        assert out["draft"] == direct["writer", after.id] != direct["writer", before.id]  # the writer's adapter
        assert direct["reviewer", after.id] == direct["reviewer", before.id]  # the reviewer kept its (no) adapter
        calls = store.calls("after-promotion")
        assert [c.system_id for c in calls] == [after.id, after.id]
        assert [c.params["served_by"]["adapter"] for c in calls] == [after.models["writer"].adapter.sha256, None]
        # streamed, and a name the team does not have
        import openai

        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        chunks = client.chat.completions.create(
            model="writer-model",
            stream=True,
            temperature=0.0,
            max_tokens=8,
            messages=[{"role": "user", "content": "fresh topic"}],
            extra_headers={"x-evolve-session": "streamed"},
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct["writer", after.id]
        assert store.calls("streamed")[0].params["served_by"]["role"] == "writer"
        with pytest.raises(openai.NotFoundError, match="writer-model"):
            client.chat.completions.create(model="planner", messages=[{"role": "user", "content": "x"}])


def test_team_routes_are_configured_by_name_or_role():
    from evolve.gateway.config import LocalConfig, RouteConfig, from_flags

    assert RouteConfig(local=LocalConfig(run="r", roles=["writer", "reviewer"])).match is None  # the roles' names
    assert RouteConfig(local=LocalConfig(run="r")).match == ["*"]  # one role: every name, as before
    assert from_flags(local="r", roles="all").routes[0].local.roles == "all"
    assert from_flags(local="r").routes[0].match == ["*"]
    with pytest.raises(ValueError, match="not both"):
        LocalConfig(run="r", role="writer", roles=["writer"])
    with pytest.raises(ValueError, match="more than once"):
        LocalConfig(run="r", roles=["writer", "writer"])
    with pytest.raises(ValueError, match="or role, not both"):
        from evolve.policy.from_traces import FromTraces

        FromTraces(role="writer", roles=["writer"])


@pytest.mark.slow
def test_from_traces_trains_only_the_writers_adapter_on_the_writers_recorded_calls(tmp_path_factory, tmp_path):
    """The team's traffic through the gateway, then an offline run with ``from_traces`` and
    ``roles: [writer]``: the child's writer has a new adapter trained on the writer's calls only,
    its reviewer is the parent's, and served again each name gets its own role's model."""
    import openai

    import evolve
    from evolve.archive import Archive
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags
    from evolve.gateway.dataset import sessions
    from evolve.policy.local import build
    from evolve.types import Message

    path, before, _ = _team_run(tmp_path_factory.mktemp("gw-team-train"))
    with GatewayServer(from_flags(local=path, roles=["writer", "reviewer"], store=tmp_path / "traces", port=0)) as gw:
        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        for i in range(12):
            for model, text in (("writer", f"topic {i}"), ("reviewer", f"review: draft {i}")):
                client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": text}],
                    temperature=0.0,
                    max_tokens=8,
                    user=f"team-{i}",
                )
            gw.gateway.store.feedback(session_id=f"team-{i}", score=1.0 if i % 4 else 0.0)
    weights = str(path.parent / "base.st")
    local = {"backend": "local", "name": "tiny", "params": {"weights": weights, "temperature": 0.0, "max_tokens": 8}}
    task = {
        "name": "team-offline",
        "seed": 0,
        "agent": "evolve.gateway.dataset:replay",
        "reward": "tests.evolve.test_gateway_dataset:agrees",
        "models": {"writer": local, "reviewer": local},
        "dataset": {
            "source": "evolve.gateway.dataset:sessions",
            "params": {"store": str(tmp_path / "traces"), "val": 0.25},
        },
        "operators": [
            {
                "name": "from_traces",
                "params": {"roles": ["writer"], "min_examples": 2, "epochs": 1, "r": 4, "replay": 0},
            }
        ],
        "budget": {"generations": 1},
    }
    report = evolve.run(task, base_dir=tmp_path, out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as archive:
        kids = [r for r in archive.records() if r.operator == "from_traces"]
        assert kids, report
        child = archive.get_system(kids[0].id)
        parent = archive.get_system(kids[0].parents[0])
        assert child.models["writer"].adapter is not None and parent.models["writer"].adapter is None
        assert child.models["reviewer"] == parent.models["reviewer"]
        train_ids = {t["id"] for t in sessions(str(tmp_path / "traces"), val=0.25)["train"]}
        n_pos = sum(1 for i in range(12) if i % 4 and f"team-{i}" in train_ids)
        info = kids[0].info["roles"]["writer"]
        assert n_pos >= 2 and info["examples"] == n_pos and info["other_role"] == len(train_ids)
        archive.set_current(child.id)  # promoted
        direct = {}
        for role in ("writer", "reviewer"):
            llm = build(child.models[role], archive.artifacts)
            direct[role] = llm.complete(
                [Message(role="user", content="fresh topic")], temperature=0.0, max_tokens=8
            ).text
            llm.close()
    with GatewayServer(from_flags(local=tmp_path / "run", roles="all", store=tmp_path / "traces2", port=0)) as gw:
        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        for role in ("writer", "reviewer"):
            r = client.chat.completions.create(
                model=role, messages=[{"role": "user", "content": "fresh topic"}], temperature=0.0, max_tokens=8
            )
            assert r.system_fingerprint == child.id and r.choices[0].message.content == direct[role]


def test_the_roles_flag_goes_with_a_local_run_instead_of_role(tmp_path, capsys):
    from evolve.cli.commands import main

    for args in (
        ["gateway", "--upstream", "openai/x", "--roles", "a,b"],
        ["gateway", "--local", str(tmp_path), "--role", "a", "--roles", "b"],
    ):
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--roles goes with --local" in err and "Traceback" not in err, (args, err)

"""world: env: OpenEnv-style environment servers (examples/env_wordgame, served by uvicorn on
loopback) driven over OpenEnv's WebSocket protocol and over HTTP; splits by seed; a down, hung or
garbage-speaking server named and never a score; a served model lifted by the prompt layer on
held-out episodes through litellm against an OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("websockets")

import evolve  # noqa: E402
from evolve.archive import Archive  # noqa: E402
from evolve.errors import ConfigError, InfraError  # noqa: E402
from evolve.types import ToolCall  # noqa: E402
from evolve.worlds.env import dataset, render, to_action  # noqa: E402
from evolve.worlds.env.client import ActionRejected, HTTPEnv, WSEnv, connect  # noqa: E402

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "env_wordgame"
sys.path.insert(0, str(EXAMPLE))
import wordgame  # noqa: E402

LESSON = "Use the feedback: every guess must fit all the marks (G, Y and .) of the guesses before it."


@pytest.fixture(scope="module")
def server():
    from evolve.gateway.asgi import ASGIServer

    s = ASGIServer(wordgame.app, "127.0.0.1", 0, "wordgame").start()
    yield s.base
    s.close()


def _serve(app):
    from evolve.gateway.asgi import ASGIServer

    return ASGIServer(app, "127.0.0.1", 0, "test env").start()


def _app(reset=None, step=None, ws=None):
    """A Starlette app answering /reset and /step (and /ws) with the given handlers."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route, WebSocketRoute

    def answer(x):
        return x if not isinstance(x, (dict, list)) else JSONResponse(x)

    routes = []
    if reset is not None:

        async def _reset(request):
            out = reset()
            return PlainTextResponse(out) if isinstance(out, str) else answer(out)

        routes.append(Route("/reset", _reset, methods=["POST"]))
    if step is not None:

        async def _step(request):
            out = step()
            return PlainTextResponse(out) if isinstance(out, str) else answer(out)

        routes.append(Route("/step", _step, methods=["POST"]))
    if ws is not None:
        routes.append(WebSocketRoute("/ws", ws))
    return Starlette(routes=routes)


# ----------------------------------------------------------------------------- the clients


@pytest.mark.parametrize("transport", ["ws", "http"])
def test_an_episode_over_each_transport(server, transport):
    env = connect(server, transport, timeout=10)
    assert env.transport == transport
    try:
        first = env.reset(seed=3)
        secret = wordgame.Game(seed=3).secret
        assert first.reward is None and first.done is False and "Guess 1 of 6" in first.observation["prompt"]
        wrong = next(w for w in wordgame.WORDS if w != secret)
        r = env.step({"message": f"my guess: {wrong}"})
        assert r.observation["board"] == [{"guess": wrong, "marks": wordgame.marks(secret, wrong)}] and r.reward == 0
        r = env.step({"message": secret})
        assert r.done is True and r.reward == pytest.approx(5 / 6)
        with pytest.raises(ActionRejected, match="unknown action field"):
            env.step({"word": secret})
    finally:
        env.close()


def test_auto_takes_the_websocket_and_falls_back_to_http(server):
    env = connect(server, "auto", timeout=10)
    assert isinstance(env, WSEnv)
    env.close()
    http_only = _serve(
        _app(
            reset=lambda: {"observation": "hi", "reward": None, "done": False},
            step=lambda: {"observation": "bye", "reward": 1, "done": True},
        )
    )
    try:
        env = connect(http_only.base, "auto", timeout=10)
        assert isinstance(env, HTTPEnv) and env.reset(seed=1).observation == "hi" and env.step({"message": "x"}).done
        env.close()
        with pytest.raises(InfraError, match="no OpenEnv WebSocket endpoint"):
            connect(http_only.base, "ws", timeout=10)
    finally:
        http_only.close()


def test_render_and_actions():
    assert render({"prompt": "board", "won": False}) == "board"
    assert render({"score": 1}) == '{"score": 1}' and render({"a": "x", "b": 2}, key="b") == "2"
    assert render("x" * 50, limit=10) == "…" + "x" * 10
    assert to_action(" crane\n", {"format": "text", "key": "message"}) == ({"message": "crane"}, "")
    assert to_action('Sure: ```json\n{"move": 3}\n```', {"format": "json"}) == ({"move": 3}, "")
    assert to_action('I pick {"move": 4} now', {"format": "json"}) == ({"move": 4}, "")
    assert to_action("[1, 2]", {"format": "json"})[0] is None and to_action("left", {"format": "json"})[0] is None


# ----------------------------------------------------------------------------- the dataset and bad input


def test_splits_are_disjoint_seeds_fixed_by_the_task_file(server):
    a = dataset(url=server, episodes={"train": 5, "val": 2, "test": 3})
    assert [t["seed"] for t in a["train"]] == [0, 1, 2, 3, 4] and [t["seed"] for t in a["test"]] == [7, 8, 9]
    b = dataset(seed=9, url=server, episodes={"train": 5, "val": 2, "test": 3})
    assert {k: [t["id"] for t in v] for k, v in a.items()} == {k: [t["id"] for t in v] for k, v in b.items()}
    c = dataset(url=server, seeds={"train": [10, 11], "val": [3], "test": [50]})
    assert [t["id"] for t in c["train"]] == ["seed-10", "seed-11"] and c["test"][0]["seed"] == 50
    assert dataset(url=server, first_seed=100, episodes={"train": 1, "val": 1, "test": 0})["val"][0]["seed"] == 101


@pytest.mark.parametrize(
    "params, match",
    [
        ({}, "one of the two"),
        ({"url": "http://127.0.0.1:1", "server": "wordgame:app"}, "one of the two"),
        ({"url": "ftp://x"}, "not an environment server URL"),
        ({"url": "http://127.0.0.1:99999"}, "bad port"),
        ({"server": "wordgame"}, "not an import path"),
        ({"server": "no_such_module_here:app"}, "cannot import module"),
        ({"server": "wordgame:WORDS"}, "not an ASGI app"),
        ({"server": "wordgame:app", "transport": "grpc"}, "transport 'grpc'"),
        ({"server": "wordgame:app", "score": "mean"}, "score 'mean'"),
        ({"server": "wordgame:app", "action": {"format": "xml"}}, "action must be"),
        ({"server": "wordgame:app", "action": {"format": "json", "key": "m"}}, "goes with format: text"),
        ({"server": "wordgame:app", "reset": {"seed": 3}}, "reset.seed"),
        ({"server": "wordgame:app", "episodes": {"train": -1}}, "episodes must map"),
        ({"server": "wordgame:app", "episodes": {"train": 0}}, "needs train and val"),
        ({"server": "wordgame:app", "seeds": {"train": [1, 2], "val": [2]}}, "seed 2 is in more than one split"),
        ({"server": "wordgame:app", "seeds": {"train": ["a"], "val": [2]}}, "non-negative integers"),
        ({"server": "wordgame:app", "timeout": 0}, "timeout must be"),
    ],
)
def test_bad_dataset_params_are_named(params, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        dataset(base_dir=EXAMPLE, **params)


def test_a_server_that_is_down_or_speaks_garbage_is_named_before_the_run():
    from tests.helpers.upstream import free_port

    port = free_port()
    with pytest.raises(InfraError, match=rf"url: http://127.0.0.1:{port}\).*unreachable"):
        dataset(url=f"http://127.0.0.1:{port}", transport="http")
    for answer, match in [
        ("<html>oops</html>", "not JSON"),
        ({"obs": 1}, "without 'observation'"),
        ({"observation": 1, "reward": "high"}, "reward of high (str)"),
        ({"observation": 1, "done": "maybe"}, "done=maybe"),
    ]:
        s = _serve(_app(reset=lambda a=answer: a))
        try:
            with pytest.raises(InfraError, match=re.escape(match)):
                dataset(url=s.base, transport="auto")
        finally:
            s.close()


def test_the_cli_says_what_is_wrong_without_a_traceback(tmp_path):
    from tests.helpers.upstream import free_port

    task = tmp_path / "task.yaml"
    task.write_text(
        json.dumps(
            {
                "name": "down",
                "world": "env",
                "models": {"policy": {"backend": "scripted", "params": {"responses": ["crane"]}}},
                "dataset": {"params": {"url": f"http://127.0.0.1:{free_port()}"}},
            }
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "evolve", "run", str(task), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 3 and "did not answer a reset before the run" in r.stderr and "Traceback" not in r.stderr
    for params, said in [
        ({"server": "nowhere:app"}, "cannot import module 'nowhere'"),
        ({"server": "wordgame:app", "episodes": {"train": 3}, "url_": "x"}, "unexpected keyword argument 'url_'"),
    ]:
        task.write_text(json.dumps({**json.loads(task.read_text()), "dataset": {"params": params}}))
        r = subprocess.run(
            [sys.executable, "-m", "evolve", "run", str(task), "--out", str(tmp_path / "run2")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr and said in r.stderr, r.stderr


# ----------------------------------------------------------------------------- episodes in a run


def _task(server: str, **over) -> dict:
    return {
        "name": "wordgame",
        "seed": 0,
        "world": "env",
        "models": {"policy": {"backend": "scripted", "params": {"reply": "tests.worlds.test_env:play"}}},
        "dataset": {"params": {"url": server, "episodes": {"train": 4, "val": 2, "test": 2}}},
        "workflow": {"max_turns": 6},
        "operators": [],
        "budget": {"generations": 0},
        "runner": {"name": "thread", "workers": 2, "timeout": 60},
        **over,
    }


def play(messages) -> str:
    return wordgame.player([m.model_dump() if hasattr(m, "model_dump") else m for m in messages])


def test_every_reset_and_step_is_recorded_and_the_return_is_the_score(server, tmp_path):
    evolve.run(_task(server, prompts={"instruction": "Use the feedback."}), out=tmp_path / "run")
    archive = Archive(tmp_path / "run")
    trajs = archive.trajectories()
    assert trajs and all(t.infra is None and t.error is None for t in trajs)
    for t in trajs:
        calls = [s for s in t.steps if isinstance(s, ToolCall)]
        assert calls[0].name == "env.reset" and calls[0].args["seed"] == int(t.task_id.split("-")[1])
        steps = [c for c in calls if c.name == "env.step"]
        assert len(steps) == len(t.output["rewards"]) == len(t.output["actions"]) and 1 <= len(steps) <= 6
        assert [c.args["action"]["message"] for c in steps] == t.output["actions"]
        assert t.score == pytest.approx(sum(c.result["reward"] or 0 for c in steps))
        assert steps[-1].result["done"] is True and "return" in t.reward.feedback
        secret = wordgame.Game(seed=t.output and int(t.task_id.split("-")[1])).secret
        assert (t.score > 0) == (t.output["actions"][-1] == secret)


def test_a_refused_action_costs_a_turn_and_is_the_agents_own(server, tmp_path):
    task = _task(server, models={"policy": {"backend": "scripted", "params": {"responses": ['{"word": "crane"}']}}})
    task["dataset"]["params"]["action"] = {"format": "json"}
    task["workflow"] = {"max_turns": 3}
    evolve.run(task, out=tmp_path / "run")
    for t in Archive(tmp_path / "run").trajectories():
        assert t.infra is None and t.score == 0 and t.output["invalid"] == 3 and t.output["actions"] == []
        errors = [s.error for s in t.steps if isinstance(s, ToolCall) and s.name == "env.step"]
        assert len(errors) == 3 and all("refused the action" in e for e in errors)


def test_a_server_failing_mid_run_is_the_world_failing_never_a_score(tmp_path):
    """/reset answers, /step breaks (a 500, then garbage, then a hang past the timeout): each is a
    recorded infrastructure failure, the run stops with the cause, and no episode is scored."""
    for step, category in [
        (lambda: (_ for _ in ()).throw(RuntimeError("boom")), "server"),
        (lambda: "not json", "server"),
        (lambda: time.sleep(3) or {"observation": 1}, "timeout"),
    ]:
        s = _serve(_app(reset=lambda: {"observation": "go", "reward": None, "done": False}, step=step))
        try:
            task = _task(s.base, models={"policy": {"backend": "scripted", "params": {"responses": ["crane"]}}})
            task["dataset"]["params"].update({"transport": "http", "timeout": 1})
            task["failures"] = {"retries": 1, "backoff": 0}
            with pytest.raises(InfraError) as e:
                evolve.run(task, out=tmp_path / category / str(id(step)))
            assert "environment server" in str(e.value)
            with Archive(tmp_path / category / str(id(step)), create=False) as a:
                assert a.trajectories() == []
        finally:
            s.close()


# ----------------------------------------------------------------------------- end to end over loopback


def respond(messages: list[dict]) -> str:
    """The scripted model behind the OpenAI-compatible server: the word-game player, and the
    reflection LLM, which adds :data:`LESSON` to the instruction when the episodes' feedback
    shows a board."""
    first = messages[0]["content"] if messages else ""
    if first.startswith("I gave an assistant the following"):
        current = re.search(r"```[a-z]*\n?(.*?)```", first, re.S).group(1).strip()
        lesson = LESSON if "Your guesses so far" in first and LESSON not in current else ""
        return "```\n" + (current + ("\n" + lesson if lesson else "")).strip() + "\n```"
    return wordgame.player(messages)


def test_a_served_model_is_lifted_by_the_prompt_layer_on_held_out_episodes(tmp_path, loopback_env):
    """examples/env_wordgame/task.yaml with its policy pointed at an OpenAI-compatible server on
    loopback (through litellm): the reflective operator carries the boards of the episodes'
    feedback into the instruction, and the evolved system wins held-out words the baseline loses."""
    from tests.helpers.servers import FakeOpenAI

    srv = FakeOpenAI(respond=respond)
    policy = {
        "backend": "litellm",
        "name": "openai/scripted",
        "params": {
            "api_base": srv.base,
            "api_key_env": "OPENAI_API_KEY",
            "max_retries": 0,
            "timeout": 10,
            "temperature": 0.0,
            "max_tokens": 16,
        },
    }
    try:
        rep = evolve.run(
            EXAMPLE / "task.yaml",
            out=tmp_path / "run",
            overrides=[
                f"models.policy={json.dumps(policy)}",
                "operators.1.params.embedder=hashing",
                "budget.generations=2",
                "dataset.params.episodes={train: 12, val: 6, test: 16}",
            ],
        )
    finally:
        srv.close()
    archive = Archive(tmp_path / "run")
    best = archive.get_system(rep["best"]["system_id"])
    assert LESSON in best.prompts["instruction"]
    paired = rep["paired"]["test"]
    assert rep["best"]["test"]["score"] > rep["baseline"]["test"]["score"] and paired["diff"] - paired["ci95"] > 0
    trajs = archive.trajectories(rep["best"]["system_id"], "test")
    assert len(trajs) == 16 and all(t.infra is None for t in trajs)
    assert {t.output["transport"] for t in trajs} == {"ws"}

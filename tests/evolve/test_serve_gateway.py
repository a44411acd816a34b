"""The rollout gateway: an unmodified agent that only speaks the OpenAI API (the `openai`
client, litellm, or a subprocess configured by its environment) has its calls recorded in
its trajectory with token ids and log-probs; the URL dies with the rollout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from evolve.gateway import rollout_route as gateway
from evolve.llm.fake import ScriptedLM
from evolve.rollout import RolloutContext, run_agent
from evolve.types import LLMCall, ModelSpec, System
from tests.helpers import DATA, make_tiny_llm

openai = pytest.importorskip("openai")
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]
SYSTEM = System(
    models={
        "policy": ModelSpec(name="tiny", params={"temperature": 0.0, "max_tokens": 16}),
        "critic": ModelSpec(backend="scripted", name="echo"),
    }
)


def ask(url: str, text: str = "say hi", **kw):
    c = openai.OpenAI(base_url=url, api_key="anything", max_retries=0, timeout=60)
    return c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": text}], **kw)


@pytest.fixture(scope="module")
def tiny():
    llm = make_tiny_llm(temperature=1.0)
    yield llm
    llm.close()


def test_openai_agent_is_recorded_in_its_trajectory(tiny):
    seen = {}

    def agent(task, ctx):
        seen["url"] = ctx.openai_base_url()
        assert ctx.openai_base_url() == seen["url"]  # one token per rollout and role
        r = ask(seen["url"], task["q"], logprobs=True)
        seen["response"] = r
        return r.choices[0].message.content

    traj = run_agent(agent, SYSTEM, {"id": "t1", "q": "say hi"}, lambda system, role: tiny, seed=7)
    assert traj.error is None and seen["url"].startswith("http://127.0.0.1:") and "/r/" in seen["url"]
    (step,) = traj.steps
    r = seen["response"]
    assert isinstance(step, LLMCall) and step.role == "policy" and step.output == traj.output
    assert step.token_ids and list(step.token_ids) == r.choices[0].model_extra["token_ids"]
    assert list(step.prompt_token_ids) == r.model_extra["prompt_token_ids"]
    assert [t.logprob for t in r.choices[0].logprobs.content] == pytest.approx(list(step.logprobs), abs=1e-6)
    assert step.temperature == 0.0  # the role's default: the request gave none
    assert r.system_fingerprint == SYSTEM.id and traj.tokens == step.prompt_tokens + step.completion_tokens
    # the same rollout replayed natively gives the same step: the gateway is a native call
    native = run_agent(
        lambda task, ctx: ctx.llm("policy").complete([{"role": "user", "content": task["q"]}]).text,
        SYSTEM,
        {"id": "t1", "q": "say hi"},
        lambda system, role: tiny,
        seed=7,
    )
    assert native.steps[0].token_ids == step.token_ids and native.output == traj.output
    with pytest.raises(openai.NotFoundError):  # the rollout is over: its token is gone
        ask(seen["url"])
    assert seen["url"].split("/r/")[1].split("/")[0] not in gateway._ROUTES


def test_an_agent_asking_top_logprobs_gets_them_where_the_model_gives_them(tiny):
    """A local role's model gives each token's likeliest alternatives; a role whose model's complete()
    takes no top_logprobs (the scripted critic) answers 400, which the agent sees and the rollout
    does not count as the world failing."""
    seen = {}

    def agent(task, ctx):
        r = ask(ctx.openai_base_url(), task["q"], logprobs=True, top_logprobs=2, max_tokens=6)
        seen["content"] = r.choices[0].logprobs.content
        with pytest.raises(openai.BadRequestError, match="top_logprobs"):
            ask(ctx.openai_base_url("critic"), "x", logprobs=True, top_logprobs=2)
        return r.choices[0].message.content

    traj = run_agent(
        agent,
        SYSTEM,
        {"id": "t1", "q": "say hi"},
        lambda system, role: tiny if role == "policy" else ScriptedLM("echo"),
        seed=3,
    )
    assert traj.error is None and len(traj.steps) == 1
    want = tiny.complete([{"role": "user", "content": "say hi"}], temperature=0.0, max_tokens=6, top_logprobs=2)
    assert [[t.token for t in e.top_logprobs] for e in seen["content"]] == [
        [tiny.tokenizer.token_text(i) for i, _ in step] for step in want.top_logprobs
    ]


def test_exploration_temperature_wins_and_failures_are_recorded():
    lm = ScriptedLM("echo")
    outs = {}

    def agent(task, ctx):
        url = ctx.openai_base_url("critic")
        outs["a"] = ask(url, "one", temperature=0.3)
        outs["b"] = ask(url, "two", n=2)
        raise RuntimeError("the agent gives up")

    traj = run_agent(agent, SYSTEM, {"id": "t"}, lambda s, r: lm, temperature=0.9)
    assert traj.error.startswith("agent raised RuntimeError")
    assert [(s.role, s.output, s.temperature) for s in traj.steps] == [("critic", "one", 0.9)] + [
        ("critic", "two", 0.9)
    ] * 2
    assert len(outs["b"].choices) == 2
    traj = run_agent(
        lambda task, ctx: ask(ctx.openai_base_url("critic"), "x", temperature=0.3).choices[0].message.content,
        SYSTEM,
        {"id": "t"},
        lambda s, r: lm,
    )
    assert traj.output == "x" and traj.steps[0].temperature == 0.3  # no rollout temperature: the request's
    with pytest.raises(KeyError, match="no model role 'judge'"):
        RolloutContext(SYSTEM, {"id": "t"}, lambda s, r: lm).openai_base_url("judge")


def test_litellm_agent_and_an_agent_configured_by_environment():
    litellm = pytest.importorskip("litellm")
    lm = ScriptedLM("echo")

    def agent(task, ctx):
        r = litellm.completion(
            model="openai/whatever",
            api_base=ctx.openai_base_url("critic"),
            api_key="x",
            messages=[{"role": "user", "content": "via litellm"}],
            num_retries=0,
        )
        env = {**os.environ, **ctx.openai_env("critic")}
        script = (
            "import json, os, urllib.request as u\n"
            "req = u.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=json.dumps("
            "{'model': 'm', 'messages': [{'role': 'user', 'content': 'from a subprocess'}]}).encode(), "
            "headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})\n"
            "print(json.load(u.urlopen(req))['choices'][0]['message']['content'])\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True, timeout=60
        )
        return [r.choices[0].message.content, out.stdout.strip() or out.stderr]

    traj = run_agent(agent, SYSTEM, {"id": "t"}, lambda s, r: lm)
    assert traj.error is None and traj.output == ["via litellm", "from a subprocess"]
    assert [s.output for s in traj.steps] == traj.output and all(s.token_ids for s in traj.steps)


def test_concurrent_rollouts_share_one_gateway_and_stay_apart():
    lm = ScriptedLM("echo", delay=0.01)
    trajs, urls = {}, set()

    def agent(task, ctx):
        urls.add(ctx.openai_base_url("critic").split("/r/")[0])
        return [ask(ctx.openai_base_url("critic"), f"{task['id']}-{i}").choices[0].message.content for i in range(3)]

    def one(i):
        trajs[i] = run_agent(agent, SYSTEM, {"id": str(i)}, lambda s, r: lm)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(urls) == 1
    for i, traj in trajs.items():
        assert traj.error is None and [s.output for s in traj.steps] == [f"{i}-{k}" for k in range(3)]


def toy_openai_agent(task, ctx):
    """evolve.worlds.toy:agent, rewritten to use only the OpenAI client."""
    c = openai.OpenAI(base_url=ctx.openai_base_url(), api_key="unused", max_retries=0)
    r = c.chat.completions.create(
        model="any",
        messages=[
            {"role": "system", "content": ctx.system.prompts.get("instruction", "")},
            {"role": "user", "content": f"{task['a']} {task['b']}"},
        ],
    )
    return r.choices[0].message.content.strip()


def test_engine_run_with_an_openai_agent(tmp_path):
    import evolve
    from evolve.archive import Archive

    report = evolve.run(
        DATA / "toy.yaml",
        out=tmp_path / "run",
        agent=toy_openai_agent,
        overrides=["budget.generations=1", "engine.minibatch=4"],
    )
    assert report["baseline"]["val"]["n"] > 0
    with Archive(tmp_path / "run", create=False) as archive:
        trajs = archive.trajectories()
    assert trajs and all(t.error is None for t in trajs)
    steps = [t.steps[0] for t in trajs]
    assert all(isinstance(s, LLMCall) and s.token_ids and s.logprobs is not None for s in steps)
    assert any(t.score == 1.0 for t in trajs)  # the scripted adder is right sometimes, through HTTP too
    assert gateway.active() == 0  # every rollout unregistered itself
    json.dumps(report)

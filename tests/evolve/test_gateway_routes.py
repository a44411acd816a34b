"""Gateway routes that serve an evolved system: a run's local model (token ids, tools in the
prompt, promotions and sticky sessions) and a run's prompt components applied to upstream requests."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.helpers.upstream import TOOLS

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


# ----------------------------------------------------------------------------- the local model


def test_local_tool_format_renders_history_and_parses_only_offered_tools():
    from evolve.gateway.local import parse_tool_calls, render

    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    out = render(msgs, TOOLS)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("be brief\n\nYou may call tools.")
    assert '"name": "lookup"' in out[0]["content"] and "<tools>" in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>',
    }
    assert out[3] == {"role": "user", "content": '<tool_response>{"name": "lookup", "content": "42"}</tool_response>'}
    text, calls = parse_tool_calls('ok <tool_call>{"name": "lookup", "arguments": {"q": "y"}}</tool_call>', TOOLS)
    assert text == "ok" and calls[0]["function"] == {"name": "lookup", "arguments": '{"q": "y"}'}
    assert parse_tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', TOOLS)[1] is None
    assert parse_tool_calls("<tool_call>not json</tool_call>", TOOLS)[1] is None
    assert parse_tool_calls('<tool_call>{"name": "lookup"}</tool_call>', None) == (
        '<tool_call>{"name": "lookup"}</tool_call>',
        None,
    )


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    from tests.helpers import two_system_run

    return two_system_run(tmp_path_factory.mktemp("gw-local"))


def test_a_local_route_records_token_ids_and_follows_a_promotion_without_a_restart(served_run, tmp_path):
    import openai

    from evolve.archive import Archive
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags
    from tests.helpers import greedy_answers

    path, a, b = served_run
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hi"}]
    want = greedy_answers(path, (a, b), msgs)
    with Archive(path, create=False) as archive:
        archive.set_current(a.id)
    cfg = from_flags(local=path, store=tmp_path / "t", port=0)
    cfg = cfg.model_validate(
        {**cfg.model_dump(), "routes": [{**cfg.routes[0].model_dump(), "local": {"run": path, "poll": 0.05}}]}
    )
    with GatewayServer(cfg) as gw:
        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        r1 = client.chat.completions.create(model="sql-agent", messages=msgs, temperature=0.0, max_tokens=16, user="s")
        assert r1.choices[0].message.content == want[a.id].text and r1.system_fingerprint == a.id
        with Archive(path, create=False) as other:  # the engine (or evolve archive rollback) moves the pointer
            other.set_current(b.id)
        deadline = time.monotonic() + 20
        while gw.gateway.routes[0].current_system() != b.id and time.monotonic() < deadline:
            time.sleep(0.02)
        stream = client.chat.completions.create(
            model="sql-agent", messages=msgs, temperature=0.0, max_tokens=16, stream=True, user="new"
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == want[b.id].text  # a new session: the promoted system
        again = client.chat.completions.create(
            model="sql-agent", messages=msgs, temperature=0.0, max_tokens=16, user="s"
        )
        assert again.choices[0].message.content == want[a.id].text  # a session goes on with its own system
        assert again.system_fingerprint == a.id
        calls = gw.gateway.store.calls()
    assert [(c.session_id, c.system_id) for c in calls] == [("s", a.id), ("new", b.id), ("s", a.id)]
    for c in calls:
        sid = c.system_id
        assert c.token_ids == list(want[sid].token_ids) and c.prompt_token_ids == list(want[sid].prompt_token_ids)
        assert c.logprobs == pytest.approx(list(want[sid].logprobs), abs=1e-5)
        assert c.upstream_model == "tiny" and c.route == "default"
        assert c.params["served_by"]["base"] == b.models["policy"].base.sha256  # streamed or not
    with Archive(path, create=False) as archive:
        archive.set_current(a.id)


def test_a_local_route_gives_top_logprobs(served_run, tmp_path):
    import openai

    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags

    path, a, b = served_run
    msgs = [{"role": "user", "content": "say hi"}]
    with GatewayServer(from_flags(local=path, store=tmp_path / "t", port=0)) as gw:
        r = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0).chat.completions.create(
            model="m", messages=msgs, temperature=0.0, max_tokens=6, logprobs=True, top_logprobs=2
        )
    content = r.choices[0].logprobs.content
    assert content and all(len(e.top_logprobs) == 2 for e in content)
    for e in content:  # greedy: the likeliest is the token drawn
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)
        assert e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob


def test_a_local_route_calls_an_offered_tool_in_the_documented_format(served_run, tmp_path, monkeypatch):
    """The tiny model cannot learn the format here, so its sampler is replaced by one that answers
    in it: what is tested is the round trip through the gateway (render, parse, record)."""
    import openai

    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags
    from evolve.gateway.run_route import ServeApp
    from evolve.llm.base import Completion

    seen = []

    def complete(self, messages, **kw):
        seen.append(messages)
        last = messages[-1]["content"]
        text = (
            "the answer is 42"
            if last.startswith("<tool_response>")
            else '<tool_call>{"name": "lookup", "arguments": {"q": "life"}}</tool_call>'
        )
        return Completion(
            text=text,
            model="tiny",
            token_ids=(1, 2, 3),
            prompt_token_ids=(4, 5),
            logprobs=(-0.1,) * 3,
            finish_reason="stop",
            prompt_tokens=2,
            completion_tokens=3,
        ), self.system_id

    monkeypatch.setattr(ServeApp, "complete", complete)
    path, a, b = served_run
    with GatewayServer(from_flags(local=path, store=tmp_path / "t", port=0)) as gw:
        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "meaning of life?"}]
        r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls" and json.loads(call.function.arguments) == {"q": "life"}
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "42"},
        ]
        r2 = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        assert r2.choices[0].message.content == "the answer is 42"
        calls = gw.gateway.store.calls()
    assert "<tools>" in seen[0][0]["content"] and seen[1][-1]["content"].startswith("<tool_response>")
    assert calls[1].session_id == calls[0].session_id  # the stateless conversation is one session
    assert calls[0].tool_calls[0]["function"]["name"] == "lookup" and calls[0].token_ids == [1, 2, 3]


# ----------------------------------------------------------------------------- evolved prompts applied


def test_a_runs_evolved_prompt_is_applied_per_request_and_a_promotion_takes_effect_without_a_restart(
    upstream, tmp_path
):
    import openai
    import yaml

    from evolve.archive import Archive
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import load_config
    from evolve.types import System

    a = System(prompts={"policy.instruction": "Answer in French."})
    b = System(prompts={"policy.instruction": "Answer in French. Cite the table you used."})
    with Archive(tmp_path / "run") as archive:
        archive.add_system(a)
        archive.add_system(b, parents=[a.id], operator="reflective")
        archive.set_current(a.id)
    (tmp_path / "gateway.yaml").write_text(
        yaml.safe_dump(
            {
                "port": 0,
                "store": "traces",
                "routes": [
                    {
                        "name": "support",
                        "match": ["gpt-*"],
                        "upstream": {"model": "openai/*", "api_base": upstream.url},
                        "evolve": {
                            "run": "run",
                            "poll": 0.01,
                            "apply": [
                                {"component": "policy.instruction"},
                                {"component": "policy.missing", "how": "append"},
                            ],
                        },
                    },
                    {"name": "plain", "match": ["*"], "upstream": {"model": "openai/*", "api_base": upstream.url}},
                ],
            }
        )
    )
    cfg = load_config(tmp_path / "gateway.yaml")
    assert cfg.store == tmp_path / "traces"
    agent_prompt = "You are the support agent. {{evolve:policy.instruction}} Be kind."
    with GatewayServer(cfg) as gw:
        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)

        def ask(model: str, session: str | None = None):
            client.chat.completions.create(
                model=model,
                messages=[{"role": "system", "content": agent_prompt}, {"role": "user", "content": "hi"}],
                extra_headers={"x-evolve-session": session} if session else None,
            )
            return upstream.requests[-1]["messages"][0]["content"]

        assert ask("gpt-x") == "You are the support agent. Answer in French. Be kind."
        assert ask("gpt-x", "kept") == "You are the support agent. Answer in French. Be kind."
        assert ask("other") == agent_prompt  # another route: untouched
        got = json.loads(urllib.request.urlopen(gw.url + "/evolve/system?model=gpt-x").read())
        assert got["system_id"] == a.id and got["prompts"] == a.prompts
        with Archive(tmp_path / "run", create=False) as other:
            other.set_current(b.id)
        time.sleep(0.05)
        assert ask("gpt-x") == "You are the support agent. Answer in French. Cite the table you used. Be kind."
        assert ask("gpt-x", "kept") == "You are the support agent. Answer in French. Be kind."  # its own system
        kept = json.loads(urllib.request.urlopen(gw.url + "/evolve/system?model=gpt-x&session=kept").read())
        assert kept["system_id"] == a.id and kept["prompts"] == a.prompts  # what that session is served
        ask("other", "hop")  # a session that began on another route is not pinned to that route's system
        assert ask("gpt-x", "hop") == "You are the support agent. Answer in French. Cite the table you used. Be kind."
        calls = gw.gateway.store.calls()
    assert [c.system_id for c in calls] == [a.id, a.id, None, b.id, a.id, None, b.id]
    assert calls[0].params["evolve_applied"] == ["policy.instruction"]  # the missing component changed nothing
    assert calls[0].request["messages"][0]["content"] == agent_prompt  # the agent's own body is kept as sent
    assert calls[0].messages[0]["content"].startswith("You are the support agent. Answer in French.")


def test_apply_rules_modes():
    from evolve.gateway.apply import Rule, apply_rules

    msgs = [{"role": "user", "content": "q"}]
    p = {"k": "EVOLVED"}
    assert apply_rules(msgs, [Rule("k", "prepend")], p) == (
        [{"role": "system", "content": "EVOLVED"}, {"role": "user", "content": "q"}],
        ["k"],
    )
    assert apply_rules(msgs, [Rule("k", "block")], p) == (msgs, [])  # no system message, no placeholder
    assert apply_rules(msgs, [Rule("k", "append", "last_user")], p)[0][-1]["content"] == "q\n\nEVOLVED"
    sys_msgs = [{"role": "system", "content": "old"}, *msgs]
    assert apply_rules(sys_msgs, [Rule("k", "replace")], p)[0][0]["content"] == "EVOLVED"
    assert sys_msgs[0]["content"] == "old"  # the input is not changed
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}],
        }
    ]
    got = apply_rules(parts, [Rule("k", "prepend", "last_user")], p)[0][0]["content"]
    assert got == [{"type": "text", "text": "EVOLVED"}, *parts[0]["content"]]  # the image stays
    demos = {"policy.demos": json.dumps([{"input": "2+2", "output": "4"}, {"input": "3+3", "output": {"n": 6}}])}
    with_demos, used = apply_rules(sys_msgs, [Rule("policy.demos", "demos")], demos)
    assert used == ["policy.demos"] and with_demos == [
        sys_msgs[0],
        {"role": "user", "content": "2+2"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3"},
        {"role": "assistant", "content": '{"n": 6}'},
        sys_msgs[1],
    ]
    assert apply_rules(sys_msgs, [Rule("policy.demos", "demos")], {"policy.demos": "not json"}) == (sys_msgs, [])

"""evolve gateway: unmodified clients (the openai and anthropic SDKs, litellm, the OpenAI Agents
SDK, LangGraph) over real HTTP, through the gateway, to a scripted OpenAI-compatible upstream on
loopback; the trace store holds exactly the calls made, in sessions. Bad input, failures, feedback
and keys."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from evolve.errors import ConfigError
from tests.helpers.upstream import ATOOLS, TOOLS, post

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


# ----------------------------------------------------------------------------- the openai SDK


def test_the_openai_sdk_sync_with_a_tool_round_trip_is_one_session_of_two_calls(gw):
    import openai

    client = openai.OpenAI(
        base_url=gw.url, api_key="unused", default_headers={"X-Evolve-Session": "user-1"}, max_retries=0
    )
    msgs = [{"role": "user", "content": "capital of France"}]
    first = client.chat.completions.create(model="gpt-test", messages=msgs, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"q": "capital of France"}
    assert first.choices[0].finish_reason == "tool_calls"
    msgs += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Paris"},
    ]
    raw = client.chat.completions.with_raw_response.create(model="gpt-test", messages=msgs, tools=TOOLS)
    second = raw.parse()
    assert second.choices[0].message.content == "the tool said: Paris"
    assert raw.headers["x-evolve-session"] == "user-1" and raw.headers["x-evolve-call-id"] == second.id

    calls = gw.gateway.store.calls()
    assert [c.id for c in calls] == [first.id, second.id]  # exactly the calls made
    assert [c.session_id for c in calls] == ["user-1", "user-1"] and [c.seq for c in calls] == [0, 1]
    assert calls[0].tools == TOOLS and calls[0].tool_calls[0]["function"]["name"] == "lookup"
    assert calls[1].messages[-1] == {"role": "tool", "tool_call_id": call.id, "content": "Paris"}
    assert calls[1].output == "the tool said: Paris" and calls[1].upstream_model == "gpt-test"
    assert all(c.status == "ok" and c.latency_s > 0 and c.prompt_tokens > 0 for c in calls)
    assert gw.gateway.store.integrity() == []


def test_the_openai_sdk_async_and_streaming_text_and_tool_calls(gw):
    import openai

    async def main():
        client = openai.AsyncOpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        whole = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a b c"}], user="async-user"
        )
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "one two"}],
            stream=True,
            stream_options={"include_usage": True},
            user="async-user",
        )
        text, ids, usage = [], set(), None
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        tools = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x y"}], tools=TOOLS, stream=True, user="async-user"
        )
        args, names = "", ""
        async for chunk in tools:
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                args += tc.function.arguments or ""
                names += tc.function.name or ""
        return whole, "".join(text), ids, usage, names, args

    whole, text, ids, usage, names, args = asyncio.run(main())
    assert whole.choices[0].message.content == "echo: a b c"
    assert text == "echo: one two" and len(ids) == 1 and usage.completion_tokens == 3
    assert names == "lookup" and json.loads(args) == {"q": "x y"}
    calls = gw.gateway.store.calls()
    assert len(calls) == 3 and {c.session_id for c in calls} == {"async-user"}
    assert calls[1].id in ids and calls[1].stream and calls[1].output == "echo: one two"
    assert calls[1].completion_tokens == 3
    assert calls[2].tool_calls == [
        {"id": calls[2].tool_calls[0]["id"], "type": "function", "function": {"name": "lookup", "arguments": args}}
    ]


# ----------------------------------------------------------------------------- the anthropic SDK


def test_the_anthropic_sdk_with_tools_whole_and_streamed_and_a_stateless_conversation_is_one_session(gw):
    import anthropic

    client = anthropic.Anthropic(base_url=gw.base, api_key="unused", max_retries=0)
    hello = client.messages.create(
        model="claude-test", max_tokens=64, system="be brief", messages=[{"role": "user", "content": "hi"}]
    )
    assert hello.content[0].text == "echo: hi" and hello.stop_reason == "end_turn" and hello.id.startswith("msg_")
    msgs = [{"role": "user", "content": "weather in Oslo"}]
    first = client.messages.create(model="claude-test", max_tokens=64, messages=msgs, tools=ATOOLS)
    use = first.content[0]
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.input == {"q": "weather in Oslo"}
    msgs += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "rain"}]},
    ]
    with client.messages.stream(model="claude-test", max_tokens=64, messages=msgs, tools=ATOOLS) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == "the tool said: rain" and final.stop_reason == "end_turn"
    with client.messages.stream(
        model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "go"}], tools=ATOOLS
    ) as stream:
        tool_final = stream.get_final_message()
    assert tool_final.content[0].type == "tool_use" and tool_final.content[0].input == {"q": "go"}
    assert final.usage.input_tokens > 0 and final.usage.output_tokens == 4
    # any string the API takes as a user is a session: one the gateway cannot use as an id is hashed
    odd = client.messages.create(
        model="claude-test",
        max_tokens=8,
        messages=[{"role": "user", "content": "u"}],
        metadata={"user_id": "auth0|abc 123"},
    )

    calls = gw.gateway.store.calls()
    assert calls[-1].id == odd.id and calls[-1].session_id.startswith("u-")
    calls = calls[:-1]
    assert [c.id for c in calls] == [hello.id, first.id, final.id, tool_final.id]
    assert tool_final.content[0].id == calls[3].tool_calls[0]["id"]  # the id the client saw is the one recorded
    assert calls[0].messages[0] == {"role": "system", "content": "be brief"} and calls[0].api == "anthropic"
    # no session named: the tool result continues the tool call's conversation, so it joins its session
    assert calls[2].session_id == calls[1].session_id == first.id and calls[2].seq == 1
    assert calls[2].messages[-1] == {"role": "tool", "tool_call_id": use.id, "content": "rain"}
    assert len({calls[0].session_id, calls[1].session_id, calls[3].session_id}) == 3


# ----------------------------------------------------------------------------- frameworks


def test_litellm_as_the_agents_client(gw):
    from evolve.llm.litellm import import_litellm

    litellm = import_litellm()
    r = litellm.completion(
        model="openai/agent-model",
        api_base=gw.url,
        api_key="unused",
        messages=[{"role": "user", "content": "ping"}],
        extra_headers={"x-evolve-session": "ll"},
        num_retries=0,
    )
    assert r.choices[0].message.content == "echo: ping"
    (call,) = gw.gateway.store.calls()
    assert call.session_id == "ll" and call.model == "agent-model" and call.id == r.id


def test_the_openai_agents_sdk_runs_an_agent_with_a_tool_through_the_gateway(gw):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    seen = []

    @agents.function_tool
    def lookup(q: str) -> str:
        """Look a thing up."""
        seen.append(q)
        return f"found {q}"

    client = AsyncOpenAI(
        base_url=gw.url, api_key="unused", default_headers={"X-Evolve-Session": "agents-sdk"}, max_retries=0
    )
    agent = agents.Agent(
        name="helper",
        instructions="Use the tool.",
        tools=[lookup],
        model=agents.OpenAIChatCompletionsModel(model="gpt-agent", openai_client=client),
    )
    result = agents.Runner.run_sync(agent, "the moon")
    assert seen == ["the moon"] and result.final_output == "the tool said: found the moon"
    calls = gw.gateway.store.calls("agents-sdk")
    assert len(calls) == 2 == len(gw.gateway.store.calls())
    assert calls[0].tool_calls[0]["function"]["name"] == "lookup"
    assert calls[0].messages[0]["role"] == "system" and calls[1].messages[-1]["role"] == "tool"


def test_a_langgraph_react_agent_with_a_tool_through_the_gateway(gw):
    pytest.importorskip("langgraph")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def lookup(q: str) -> str:
        """Look a thing up."""
        return f"found {q}"

    llm = ChatOpenAI(
        model="gpt-graph",
        base_url=gw.url,
        api_key="unused",
        max_retries=0,
        default_headers={"X-Evolve-Session": "langgraph"},
    )
    graph = create_react_agent(llm, [lookup])
    out = graph.invoke({"messages": [("user", "the sea")]})
    assert out["messages"][-1].content == "the tool said: found the sea"
    calls = gw.gateway.store.calls("langgraph")
    assert len(calls) == 2 and calls[0].tool_calls and calls[1].messages[-1]["content"] == "found the sea"


# ----------------------------------------------------------------------------- bad input, failures, feedback


BAD_OPENAI = [
    b"not json",
    b"[1, 2]",
    {"messages": [{"role": "user", "content": "x"}]},
    {"model": "m"},
    {"model": "m", "messages": []},
    {"model": "m", "messages": ["hi"]},
    {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
    {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
    {"model": "m", "messages": [{"role": "user", "content": 3}]},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": float("inf")},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "metadata": "s"},
    {"model": "m", "messages": [{"role": "assistant", "content": None, "tool_calls": ["x"]}]},
    {"model": "m", "messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": None}]}]},
    b"[" * 100_000,
    b'{"model": "m", "n": ' + b"9" * 5000 + b"}",
]
BAD_ANTHROPIC = [
    b"{",
    {"model": "m", "messages": [{"role": "user", "content": "x"}]},
    {"model": "m", "max_tokens": 5, "messages": []},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{}]},
    {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
        "tool_choice": {"type": "sometimes"},
    },
]


def _raw_post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
    return post(url, data)


def test_malformed_requests_get_api_shaped_4xx_and_the_gateway_stays_up(gw):
    for body in BAD_OPENAI:
        status, err = _raw_post(gw.url + "/chat/completions", body)
        assert status == 400, body
        assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["message"], body
    for body in BAD_ANTHROPIC:
        status, err = _raw_post(gw.base + "/v1/messages", body)
        assert status == 400, body
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", body
    status, err = post(gw.base + "/v2/nothing", {})
    assert status == 404 and "Invalid URL" in err["error"]["message"]
    good = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    # a web page cannot drive the gateway: a text/plain body (a "simple" cross-site POST), an Origin, a rebound Host
    assert post(gw.url + "/chat/completions", json.dumps(good).encode(), {"content-type": "text/plain"})[0] == 415
    assert post(gw.url + "/chat/completions", good, {"origin": "https://evil.example"})[0] == 403
    assert post(gw.url + "/feedback", {"session_id": "x", "score": 1}, {"origin": "https://evil.example"})[0] == 403
    assert post(gw.url + "/chat/completions", good, {"host": "attacker.example"})[0] == 403
    assert gw.gateway.store.counts()["calls"] == 0  # a refused request is not a call
    status, ok = post(gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "ok"}]})
    assert status == 200 and ok["choices"][0]["message"]["content"] == "echo: ok"


def test_an_upstream_failure_is_the_status_the_client_expects_and_recorded_as_an_error(gw):
    import anthropic
    import openai

    client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
    with pytest.raises(openai.RateLimitError):  # streamed too: the status comes before the stream starts
        client.chat.completions.create(model="fail-429", messages=[{"role": "user", "content": "x"}], stream=True)
    with pytest.raises(anthropic.APIStatusError) as e:
        with anthropic.Anthropic(base_url=gw.base, api_key="u", max_retries=0).messages.stream(
            model="fail-500", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        ) as st:
            st.get_final_message()
    assert e.value.status_code == 502
    gw.gateway.store.calls()  # the two streamed failures are recorded too
    assert [c.status for c in gw.gateway.store.calls()] == ["error", "error"]
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="fail-429", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="fail-500", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 502 and "upstream" in str(e.value)
    with pytest.raises(anthropic.APIStatusError) as e:
        anthropic.Anthropic(base_url=gw.base, api_key="u", max_retries=0).messages.create(
            model="fail-500", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert e.value.status_code == 502
    calls = gw.gateway.store.calls()
    assert [c.status for c in calls] == ["error"] * 5 and calls[0].error.startswith("429")


def test_a_client_that_drops_a_stream_half_way_has_its_call_recorded_as_cut(gw):
    import httpx

    body = {"model": "drip-300", "stream": True, "messages": [{"role": "user", "content": "one two three four five"}]}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", gw.url + "/chat/completions", json=body) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # the first chunk, then the client goes away
    deadline = time.time() + 20
    while not gw.gateway.store.calls() and time.time() < deadline:
        time.sleep(0.05)
    (call,) = gw.gateway.store.calls()
    assert call.status == "error" and call.error.startswith("499") and call.stream
    assert post(gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "ok"}]})[0] == 200


def test_feedback_over_http_is_idempotent_by_id_and_checks_what_it_is_about(gw):
    status, r = post(
        gw.url + "/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "q"}], "user": "fb-session"},
    )
    cid = r["id"]
    fb = {"id": "fb-1", "session_id": "fb-session", "score": 1.0, "components": {"correct": 1}, "text": "right"}
    assert post(gw.url + "/feedback", fb) == (
        201,
        {"id": "fb-1", "session_id": "fb-session", "call_id": None, "recorded": True},
    )
    assert post(gw.url + "/feedback", fb)[1]["recorded"] is False  # sent twice: recorded once
    status, by_call = post(gw.url + "/feedback", {"call_id": cid, "score": 0.5})
    assert status == 201 and by_call["session_id"] == "fb-session"
    assert post(gw.url + "/feedback", {"call_id": cid, "score": 0.5})[1]["recorded"] is False  # same content
    for bad in (
        {"score": 1},
        {"session_id": "nope", "score": 1},
        {"call_id": "nope", "score": 1},
        {"session_id": "fb-session"},
        {"session_id": "fb-session", "score": "high"},
        {"session_id": "fb-session", "score": 1, "stars": 5},
        [1],
    ):
        status, err = post(gw.url + "/feedback", bad)
        assert status == 400 and err["error"]["message"], bad
    post(
        gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "q"}], "user": "fb-other"}
    )
    status, err = post(gw.url + "/feedback", {**fb, "session_id": "fb-other"})
    assert status == 400 and "already given to session 'fb-session'" in err["error"]["message"]
    got = gw.gateway.store.feedback_of(session_id="fb-session")
    assert [(f.id, f.score, f.components) for f in got][:1] == [("fb-1", 1.0, {"correct": 1.0})] and len(got) == 2
    # the Python call is the same store
    from evolve.gateway import TraceStore

    _, new = TraceStore(gw.cfg.store).feedback(session_id="fb-session", score=1.0, id="fb-1")
    assert new is False


def test_beyond_loopback_a_key_is_required_and_checked_in_each_apis_shape(upstream, tmp_path, monkeypatch):
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags

    def cfg(host, key_env):
        return from_flags(
            upstream="openai/*",
            api_base=upstream.url,
            upstream_key_env=None,
            store=tmp_path / "t",
            host=host,
            port=0,
            api_key_env=key_env,
        )

    with pytest.raises(ConfigError, match="needs an API key"):
        GatewayServer(cfg("0.0.0.0", None))
    with pytest.raises(ConfigError, match="GW_KEY.*not set"):
        GatewayServer(cfg("127.0.0.1", "GW_KEY"))
    monkeypatch.setenv("GW_KEY", "s3cret")
    import anthropic
    import openai

    with GatewayServer(cfg("127.0.0.1", "GW_KEY")) as gw:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=gw.url, api_key="wrong", max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=gw.base, api_key="wrong", max_retries=0).messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )
        ok = openai.OpenAI(base_url=gw.url, api_key="s3cret").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
        assert ok.choices[0].message.content == "echo: x"
        assert (
            anthropic.Anthropic(base_url=gw.base, api_key="s3cret")
            .messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "y"}])
            .content[0]
            .text
            == "echo: y"
        )
        assert gw.gateway.store.counts()["calls"] == 2


def test_the_upstream_key_is_sent_upstream_and_never_recorded(upstream, tmp_path, monkeypatch):
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags

    monkeypatch.setenv("UP_KEY", "sk-upstream-secret")
    cfg = from_flags(
        upstream="openai/*",
        api_base=upstream.url,
        upstream_key_env="UP_KEY",
        store=tmp_path / "t",
        host="127.0.0.1",
        port=0,
        api_key_env=None,
    )
    import openai

    with GatewayServer(cfg) as gw:
        openai.OpenAI(base_url=gw.url, api_key="agent-key").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert upstream.headers[-1]["authorization"] == "Bearer sk-upstream-secret"
    data = (tmp_path / "t" / "traces.sqlite").read_bytes() + b"".join(
        p.read_bytes() for p in (tmp_path / "t").glob("traces.sqlite-*")
    )
    assert b"sk-upstream-secret" not in data and b"agent-key" not in data


def test_a_gateway_yaml_with_a_mistake_is_a_clear_error(tmp_path):
    from evolve.gateway.config import load_config

    f = tmp_path / "gateway.yaml"
    f.write_text("routes:\n  - upstream: {model: openai/x}\n    matches: ['*']\n")
    with pytest.raises(ConfigError, match=r"routes\.0\.matches: unknown field.*match"):
        load_config(f)
    f.write_text("port: 4000\n")
    with pytest.raises(ConfigError, match="routes: required field is missing"):
        load_config(f)
    f.write_text(
        "store: here\nroutes:\n  - {name: a, upstream: {model: 'openai/*'}}\n  - {name: a, upstream: {model: m}}\n"
    )
    with pytest.raises(ConfigError, match="route names must be unique"):
        load_config(f)

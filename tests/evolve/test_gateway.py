"""evolve gateway: unmodified clients (the openai and anthropic SDKs, litellm, the OpenAI Agents
SDK, LangGraph) over real HTTP, through the gateway, to a scripted OpenAI-compatible upstream on
loopback; the trace store holds exactly the calls made, in sessions."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from evolve.errors import ConfigError, UserError
from tests.helpers import ROOT
from tests.helpers.upstream import ScriptedUpstream, free_port

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "look a thing up",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                          "required": ["q"]}}}]
ATOOLS = [{"name": "lookup", "description": "look a thing up",
           "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}]


@pytest.fixture(scope="module")
def upstream():
    with ScriptedUpstream() as up:
        yield up


@pytest.fixture()
def gw(upstream, tmp_path):
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags

    cfg = from_flags(upstream="openai/*", api_base=upstream.url, upstream_key_env=None, store=tmp_path / "traces",
                     host="127.0.0.1", port=0, api_key_env=None)
    with GatewayServer(cfg) as server:
        yield server


def _post(url: str, body, headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# ----------------------------------------------------------------------------- the openai SDK


def test_the_openai_sdk_sync_with_a_tool_round_trip_is_one_session_of_two_calls(gw):
    import openai

    client = openai.OpenAI(base_url=gw.url, api_key="unused", default_headers={"X-Evolve-Session": "user-1"},
                           max_retries=0)
    msgs = [{"role": "user", "content": "capital of France"}]
    first = client.chat.completions.create(model="gpt-test", messages=msgs, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"q": "capital of France"}
    assert first.choices[0].finish_reason == "tool_calls"
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "Paris"}]
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
        whole = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a b c"}],
                                                     user="async-user")
        stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one two"}],
                                                      stream=True, stream_options={"include_usage": True},
                                                      user="async-user")
        text, ids, usage = [], set(), None
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        tools = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x y"}],
                                                     tools=TOOLS, stream=True, user="async-user")
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
    assert calls[2].tool_calls == [{"id": calls[2].tool_calls[0]["id"], "type": "function",
                                    "function": {"name": "lookup", "arguments": args}}]


# ----------------------------------------------------------------------------- the anthropic SDK


def test_the_anthropic_sdk_with_tools_whole_and_streamed_and_a_stateless_conversation_is_one_session(gw):
    import anthropic

    client = anthropic.Anthropic(base_url=gw.base, api_key="unused", max_retries=0)
    hello = client.messages.create(model="claude-test", max_tokens=64, system="be brief",
                                   messages=[{"role": "user", "content": "hi"}])
    assert hello.content[0].text == "echo: hi" and hello.stop_reason == "end_turn" and hello.id.startswith("msg_")
    msgs = [{"role": "user", "content": "weather in Oslo"}]
    first = client.messages.create(model="claude-test", max_tokens=64, messages=msgs, tools=ATOOLS)
    use = first.content[0]
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.input == {"q": "weather in Oslo"}
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "rain"}]}]
    with client.messages.stream(model="claude-test", max_tokens=64, messages=msgs, tools=ATOOLS) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == "the tool said: rain" and final.stop_reason == "end_turn"
    with client.messages.stream(model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "go"}],
                                tools=ATOOLS) as stream:
        tool_final = stream.get_final_message()
    assert tool_final.content[0].type == "tool_use" and tool_final.content[0].input == {"q": "go"}
    assert final.usage.input_tokens > 0 and final.usage.output_tokens == 4
    # any string the API takes as a user is a session: one the gateway cannot use as an id is hashed
    odd = client.messages.create(model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "u"}],
                                 metadata={"user_id": "auth0|abc 123"})

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
    r = litellm.completion(model="openai/agent-model", api_base=gw.url, api_key="unused",
                           messages=[{"role": "user", "content": "ping"}], extra_headers={"x-evolve-session": "ll"},
                           num_retries=0)
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

    client = AsyncOpenAI(base_url=gw.url, api_key="unused", default_headers={"X-Evolve-Session": "agents-sdk"},
                         max_retries=0)
    agent = agents.Agent(name="helper", instructions="Use the tool.", tools=[lookup],
                         model=agents.OpenAIChatCompletionsModel(model="gpt-agent", openai_client=client))
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

    llm = ChatOpenAI(model="gpt-graph", base_url=gw.url, api_key="unused", max_retries=0,
                     default_headers={"X-Evolve-Session": "langgraph"})
    graph = create_react_agent(llm, [lookup])
    out = graph.invoke({"messages": [("user", "the sea")]})
    assert out["messages"][-1].content == "the tool said: found the sea"
    calls = gw.gateway.store.calls("langgraph")
    assert len(calls) == 2 and calls[0].tool_calls and calls[1].messages[-1]["content"] == "found the sea"


# ----------------------------------------------------------------------------- bad input, failures, feedback


BAD_OPENAI = [b"not json", b"[1, 2]", {"messages": [{"role": "user", "content": "x"}]},
              {"model": "m"}, {"model": "m", "messages": []}, {"model": "m", "messages": ["hi"]},
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
              b"[" * 100_000, b'{"model": "m", "n": ' + b"9" * 5000 + b"}"]
BAD_ANTHROPIC = [b"{", {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                 {"model": "m", "max_tokens": 5, "messages": []},
                 {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
                 {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
                 {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
                 {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{}]},
                 {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                  "tool_choice": {"type": "sometimes"}}]


def _raw_post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
    return _post(url, data)


def test_malformed_requests_get_api_shaped_4xx_and_the_gateway_stays_up(gw):
    for body in BAD_OPENAI:
        status, err = _raw_post(gw.url + "/chat/completions", body)
        assert status == 400, body
        assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["message"], body
    for body in BAD_ANTHROPIC:
        status, err = _raw_post(gw.base + "/v1/messages", body)
        assert status == 400, body
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", body
    status, err = _post(gw.base + "/v2/nothing", {})
    assert status == 404 and "Invalid URL" in err["error"]["message"]
    good = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    # a web page cannot drive the gateway: a text/plain body (a "simple" cross-site POST), an Origin, a rebound Host
    assert _post(gw.url + "/chat/completions", json.dumps(good).encode(), {"content-type": "text/plain"})[0] == 415
    assert _post(gw.url + "/chat/completions", good, {"origin": "https://evil.example"})[0] == 403
    assert _post(gw.url + "/feedback", {"session_id": "x", "score": 1}, {"origin": "https://evil.example"})[0] == 403
    assert _post(gw.url + "/chat/completions", good, {"host": "attacker.example"})[0] == 403
    assert gw.gateway.store.counts()["calls"] == 0  # a refused request is not a call
    status, ok = _post(gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "ok"}]})
    assert status == 200 and ok["choices"][0]["message"]["content"] == "echo: ok"


def test_an_upstream_failure_is_the_status_the_client_expects_and_recorded_as_an_error(gw):
    import anthropic
    import openai

    client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
    with pytest.raises(openai.RateLimitError):  # streamed too: the status comes before the stream starts
        client.chat.completions.create(model="fail-429", messages=[{"role": "user", "content": "x"}], stream=True)
    with pytest.raises(anthropic.APIStatusError) as e:
        with anthropic.Anthropic(base_url=gw.base, api_key="u", max_retries=0).messages.stream(
                model="fail-500", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as st:
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
            model="fail-500", max_tokens=5, messages=[{"role": "user", "content": "x"}])
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
    assert _post(gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "ok"}]})[0] == 200


def test_feedback_over_http_is_idempotent_by_id_and_checks_what_it_is_about(gw):
    status, r = _post(gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "q"}],
                                                      "user": "fb-session"})
    cid = r["id"]
    fb = {"id": "fb-1", "session_id": "fb-session", "score": 1.0, "components": {"correct": 1}, "text": "right"}
    assert _post(gw.url + "/feedback", fb) == (201, {"id": "fb-1", "session_id": "fb-session", "call_id": None,
                                                     "recorded": True})
    assert _post(gw.url + "/feedback", fb)[1]["recorded"] is False  # sent twice: recorded once
    status, by_call = _post(gw.url + "/feedback", {"call_id": cid, "score": 0.5})
    assert status == 201 and by_call["session_id"] == "fb-session"
    assert _post(gw.url + "/feedback", {"call_id": cid, "score": 0.5})[1]["recorded"] is False  # same content
    for bad in ({"score": 1}, {"session_id": "nope", "score": 1}, {"call_id": "nope", "score": 1},
                {"session_id": "fb-session"}, {"session_id": "fb-session", "score": "high"},
                {"session_id": "fb-session", "score": 1, "stars": 5}, [1]):
        status, err = _post(gw.url + "/feedback", bad)
        assert status == 400 and err["error"]["message"], bad
    _post(gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "q"}],
                                         "user": "fb-other"})
    status, err = _post(gw.url + "/feedback", {**fb, "session_id": "fb-other"})
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
        return from_flags(upstream="openai/*", api_base=upstream.url, upstream_key_env=None, store=tmp_path / "t",
                          host=host, port=0, api_key_env=key_env)

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
                model="m", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=gw.base, api_key="wrong", max_retries=0).messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        ok = openai.OpenAI(base_url=gw.url, api_key="s3cret").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}])
        assert ok.choices[0].message.content == "echo: x"
        assert anthropic.Anthropic(base_url=gw.base, api_key="s3cret").messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "y"}]).content[0].text == "echo: y"
        assert gw.gateway.store.counts()["calls"] == 2


def test_the_upstream_key_is_sent_upstream_and_never_recorded(upstream, tmp_path, monkeypatch):
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags

    monkeypatch.setenv("UP_KEY", "sk-upstream-secret")
    cfg = from_flags(upstream="openai/*", api_base=upstream.url, upstream_key_env="UP_KEY", store=tmp_path / "t",
                     host="127.0.0.1", port=0, api_key_env=None)
    import openai

    with GatewayServer(cfg) as gw:
        openai.OpenAI(base_url=gw.url, api_key="agent-key").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}])
    assert upstream.headers[-1]["authorization"] == "Bearer sk-upstream-secret"
    data = (tmp_path / "t" / "traces.sqlite").read_bytes() + b"".join(
        p.read_bytes() for p in (tmp_path / "t").glob("traces.sqlite-*"))
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
    f.write_text("store: here\nroutes:\n  - {name: a, upstream: {model: 'openai/*'}}\n  - {name: a, upstream: {model: m}}\n")
    with pytest.raises(ConfigError, match="route names must be unique"):
        load_config(f)


# ----------------------------------------------------------------------------- kill -9, the CLI


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the gateway exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the gateway did not start")


def test_kill_9_under_32_concurrent_sessions_loses_no_finished_call(upstream, tmp_path):
    from evolve.gateway import TraceStore

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "evolve", "gateway", "--upstream", "openai/*", "--api-base",
                             upstream.url, "--store", str(tmp_path / "traces"), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait_port(port, proc)
        done: dict[str, list[str]] = {}
        stop = threading.Event()

        def user(i: int) -> None:
            sid, ids = f"user-{i}", []
            done[sid] = ids
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    status, r = _post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                      {"model": "slow-20", "messages": [{"role": "user", "content": f"{i} {n}"}]},
                                      {"x-evolve-session": sid})
                except OSError:
                    return  # the gateway died under this request: it never finished
                if status == 200:
                    ids.append(r["id"])

        threads = [threading.Thread(target=user, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        time.sleep(3.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    finished = {cid for ids in done.values() for cid in ids}
    store = TraceStore(tmp_path / "traces", create=False)
    stored = {c.id: c for c in store.calls()}
    assert len(finished) > 32  # calls did finish before the kill
    assert finished <= set(stored)  # every call an agent saw finish is in the store
    assert len(stored) - len(finished) <= 32  # at most the ones in flight at the kill (answered, never received)
    for sid, ids in done.items():
        assert [c.id for c in store.calls(sid)][:len(ids)] == ids  # in the order the agent made them
    assert store.integrity() == []


def test_the_traces_cli_lists_shows_and_takes_feedback(gw, capsys):
    from evolve.cli import main

    _post(gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "cli"}],
                                         "user": "cli-s"})
    store = str(gw.cfg.store)
    main(["traces", "ls", store])
    assert "cli-s" in capsys.readouterr().out
    main(["traces", "feedback", store, "cli-s", "--score", "1", "--component", "correct=1", "--text", "good"])
    assert "recorded" in capsys.readouterr().out
    main(["traces", "show", store, "cli-s"])
    out = capsys.readouterr().out
    assert "echo: cli" in out and "score 1.0" in out
    main(["traces", "check", store])
    assert capsys.readouterr().out.strip() == "ok"
    with pytest.raises(SystemExit) as e:
        main(["traces", "feedback", store, "cli-s", "--component", "correct"])
    assert e.value.code == 2 and "NAME=NUMBER" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["traces", "show", store, "nobody"])
    assert "no session 'nobody'" in capsys.readouterr().err


def test_traces_cli_on_a_missing_store_is_a_user_error(tmp_path, capsys):
    from evolve.cli import main

    with pytest.raises(SystemExit) as e:
        main(["traces", "ls", str(tmp_path / "none")])
    assert e.value.code == 2 and "no trace store" in capsys.readouterr().err
    with pytest.raises(UserError):
        from evolve.gateway import TraceStore

        TraceStore(tmp_path / "none", create=False)


def test_import_evolve_gateway_loads_no_http_stack():
    code = ("import sys, evolve, evolve.gateway, evolve.gateway.cli; "
            "bad = [m for m in ('starlette', 'uvicorn', 'litellm') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(ROOT), check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- the local model


def test_local_tool_format_renders_history_and_parses_only_offered_tools():
    from evolve.gateway.local import parse_tool_calls, render

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    out = render(msgs, TOOLS)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("be brief\n\nYou may call tools.")
    assert '"name": "lookup"' in out[0]["content"] and "<tools>" in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": '<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>'}
    assert out[3] == {"role": "user", "content": '<tool_response>{"name": "lookup", "content": "42"}</tool_response>'}
    text, calls = parse_tool_calls('ok <tool_call>{"name": "lookup", "arguments": {"q": "y"}}</tool_call>', TOOLS)
    assert text == "ok" and calls[0]["function"] == {"name": "lookup", "arguments": '{"q": "y"}'}
    assert parse_tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', TOOLS)[1] is None
    assert parse_tool_calls("<tool_call>not json</tool_call>", TOOLS)[1] is None
    assert parse_tool_calls('<tool_call>{"name": "lookup"}</tool_call>', None) == (
        '<tool_call>{"name": "lookup"}</tool_call>', None)


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
    cfg = cfg.model_validate({**cfg.model_dump(), "routes": [{**cfg.routes[0].model_dump(),
                                                              "local": {"run": path, "poll": 0.05}}]})
    with GatewayServer(cfg) as gw:
        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        r1 = client.chat.completions.create(model="sql-agent", messages=msgs, temperature=0.0, max_tokens=16,
                                            user="s")
        assert r1.choices[0].message.content == want[a.id].text and r1.system_fingerprint == a.id
        with Archive(path, create=False) as other:  # the engine (or evolve archive rollback) moves the pointer
            other.set_current(b.id)
        deadline = time.monotonic() + 20
        while gw.gateway.routes[0].current_system() != b.id and time.monotonic() < deadline:
            time.sleep(0.02)
        stream = client.chat.completions.create(model="sql-agent", messages=msgs, temperature=0.0, max_tokens=16,
                                                stream=True, user="new")
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == want[b.id].text  # a new session: the promoted system
        again = client.chat.completions.create(model="sql-agent", messages=msgs, temperature=0.0, max_tokens=16,
                                               user="s")
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


def test_a_local_route_calls_an_offered_tool_in_the_documented_format(served_run, tmp_path, monkeypatch):
    """The tiny model cannot learn the format here, so its sampler is replaced by one that answers
    in it: what is tested is the round trip through the gateway (render, parse, record)."""
    import openai

    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags
    from evolve.llm.base import Completion
    from evolve.serve.app import ServeApp

    seen = []

    def complete(self, messages, **kw):
        seen.append(messages)
        last = messages[-1]["content"]
        text = ("the answer is 42" if last.startswith("<tool_response>")
                else '<tool_call>{"name": "lookup", "arguments": {"q": "life"}}</tool_call>')
        return Completion(text=text, model="tiny", token_ids=(1, 2, 3), prompt_token_ids=(4, 5), logprobs=(-0.1,) * 3,
                          finish_reason="stop", prompt_tokens=2, completion_tokens=3), self.system_id

    monkeypatch.setattr(ServeApp, "complete", complete)
    path, a, b = served_run
    with GatewayServer(from_flags(local=path, store=tmp_path / "t", port=0)) as gw:
        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "meaning of life?"}]
        r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls" and json.loads(call.function.arguments) == {"q": "life"}
        msgs += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "42"}]
        r2 = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        assert r2.choices[0].message.content == "the answer is 42"
        calls = gw.gateway.store.calls()
    assert "<tools>" in seen[0][0]["content"] and seen[1][-1]["content"].startswith("<tool_response>")
    assert calls[1].session_id == calls[0].session_id  # the stateless conversation is one session
    assert calls[0].tool_calls[0]["function"]["name"] == "lookup" and calls[0].token_ids == [1, 2, 3]


# ----------------------------------------------------------------------------- evolved prompts applied


def test_a_runs_evolved_prompt_is_applied_per_request_and_a_promotion_takes_effect_without_a_restart(
        upstream, tmp_path):
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
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump({"port": 0, "store": "traces", "routes": [
        {"name": "support", "match": ["gpt-*"], "upstream": {"model": "openai/*", "api_base": upstream.url},
         "evolve": {"run": "run", "poll": 0.01, "apply": [{"component": "policy.instruction"},
                                                         {"component": "policy.missing", "how": "append"}]}},
        {"name": "plain", "match": ["*"], "upstream": {"model": "openai/*", "api_base": upstream.url}}]}))
    cfg = load_config(tmp_path / "gateway.yaml")
    assert cfg.store == tmp_path / "traces"
    agent_prompt = "You are the support agent. {{evolve:policy.instruction}} Be kind."
    with GatewayServer(cfg) as gw:
        client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)

        def ask(model: str, session: str | None = None):
            client.chat.completions.create(model=model, messages=[
                {"role": "system", "content": agent_prompt}, {"role": "user", "content": "hi"}],
                extra_headers={"x-evolve-session": session} if session else None)
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
    assert apply_rules(msgs, [Rule("k", "prepend")], p) == ([{"role": "system", "content": "EVOLVED"},
                                                             {"role": "user", "content": "q"}], ["k"])
    assert apply_rules(msgs, [Rule("k", "block")], p) == (msgs, [])  # no system message, no placeholder
    assert apply_rules(msgs, [Rule("k", "append", "last_user")], p)[0][-1]["content"] == "q\n\nEVOLVED"
    sys_msgs = [{"role": "system", "content": "old"}, *msgs]
    assert apply_rules(sys_msgs, [Rule("k", "replace")], p)[0][0]["content"] == "EVOLVED"
    assert sys_msgs[0]["content"] == "old"  # the input is not changed
    parts = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}]}]
    got = apply_rules(parts, [Rule("k", "prepend", "last_user")], p)[0][0]["content"]
    assert got == [{"type": "text", "text": "EVOLVED"}, *parts[0]["content"]]  # the image stays
    demos = {"policy.demos": json.dumps([{"input": "2+2", "output": "4"}, {"input": "3+3", "output": {"n": 6}}])}
    with_demos, used = apply_rules(sys_msgs, [Rule("policy.demos", "demos")], demos)
    assert used == ["policy.demos"] and with_demos == [
        sys_msgs[0], {"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3"}, {"role": "assistant", "content": '{"n": 6}'}, sys_msgs[1]]
    assert apply_rules(sys_msgs, [Rule("policy.demos", "demos")], {"policy.demos": "not json"}) == (sys_msgs, [])


# ----------------------------------------------------------------------------- OpenTelemetry


class _Collector:
    """A real OTLP/gRPC trace receiver on loopback (the collector's own service definition)."""

    def __enter__(self):
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as svc

        self.spans = []
        outer = self

        class Receiver(svc.TraceServiceServicer):
            def Export(self, request, context):
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        outer.spans.extend(ss.spans)
                return pb.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        svc.add_TraceServiceServicer_to_server(Receiver(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc):
        self.server.stop(0)

    def attrs(self, span) -> dict:
        out = {}
        for kv in span.attributes:
            v = kv.value
            kind = v.WhichOneof("value")
            out[kv.key] = list(x.string_value for x in v.array_value.values) if kind == "array_value" else getattr(v, kind)
        return out


def test_calls_become_gen_ai_spans_at_a_real_otlp_collector_live_and_afterwards(upstream, tmp_path, capsys):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    import openai

    from evolve.cli import main
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags

    with _Collector() as col:
        cfg = from_flags(upstream="openai/*", api_base=upstream.url, store=tmp_path / "t", port=0)
        cfg = cfg.model_validate({**cfg.model_dump(), "otel": {"endpoint": col.endpoint}})
        with GatewayServer(cfg) as gw:
            client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
            r = client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "secret words"}],
                                               temperature=0.5, user="otel-s")
            with pytest.raises(openai.APIStatusError):
                client.chat.completions.create(model="fail-500", messages=[{"role": "user", "content": "x"}])
        deadline = time.time() + 20
        while len(col.spans) < 2 and time.time() < deadline:
            time.sleep(0.05)
        ok, failed = col.spans[:2]
        a = col.attrs(ok)
        assert ok.name == "chat gpt-x" and a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.response.id"] == r.id and a["gen_ai.conversation.id"] == "otel-s"
        assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.usage.output_tokens"] == 3
        assert a["gen_ai.response.finish_reasons"] == ["stop"] and ok.end_time_unix_nano > ok.start_time_unix_nano
        assert "gen_ai.input.messages" not in a  # contents only when asked
        assert col.attrs(failed)["error.type"] == "502" and failed.status.code == 2
        before = len(col.spans)
        main(["traces", "otel", str(tmp_path / "t"), "--endpoint", col.endpoint, "--capture-content"])
        assert "sent 2 spans" in capsys.readouterr().out
        deadline = time.time() + 20
        while len(col.spans) < before + 2 and time.time() < deadline:
            time.sleep(0.05)
        again = col.attrs(col.spans[before])
        assert "secret words" in again["gen_ai.input.messages"] and "echo: secret words" in again["gen_ai.output.messages"]


def test_the_gateway_commands_say_what_is_wrong_without_a_traceback(tmp_path, capsys):
    from evolve.cli import main

    for args, code, says in (
            (["gateway", str(tmp_path / "none.yaml")], 2, "no gateway config file"),
            (["gateway"], 2, "needs a gateway.yaml, --upstream MODEL or --local RUN_DIR"),
            (["gateway", "--upstream", "openai/x", "--local", str(tmp_path)], 2, "give one of"),
            (["gateway", "--upstream", "openai/x", "--host", "0.0.0.0"], 2, "needs an API key"),
            (["gateway", "--local", str(tmp_path / "nope")], 2, "not an evolvekit run directory")):
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err
        assert e.value.code == code and says in err and "Traceback" not in err, (args, err)


def test_otel_export_to_a_collector_that_is_not_there_fails_loudly(gw, capsys):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    from evolve.cli import main

    _post(gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(SystemExit) as e:
        main(["traces", "otel", str(gw.cfg.store), "--endpoint", f"http://127.0.0.1:{free_port()}"])
    assert e.value.code == 3 and "did not take 1 of 1 spans" in capsys.readouterr().err

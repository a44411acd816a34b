"""`evolve serve`: an OpenAI-compatible endpoint over real loopback HTTP, driven by the real
`openai` and `litellm` clients; API keys, errors, hot swap on promotion, call recording, the CLI."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolve.errors import ConfigError, LLMError, UserError
from evolve.gateway.asgi import check_bind
from evolve.gateway.local import serve_llm
from evolve.gateway.run_route import ServeApp
from evolve.llm.fake import ScriptedLM
from evolve.types import LLMCall, Message, ModelSpec, System
from tests.helpers import greedy_answers, make_tiny_llm, two_system_run

openai = pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hi"}]


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)


def raw(port: int, method: str, path: str, body: bytes | None = None, conn=None, headers=None):
    """One request on a (kept-alive) connection; returns (status, decoded JSON, connection)."""
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    data = resp.read()
    assert int(resp.headers["Content-Length"]) == len(data)
    return resp.status, json.loads(data), conn


# ----------------------------------------------------------------------------- a tiny local model


@pytest.fixture(scope="module")
def tiny():
    llm = make_tiny_llm(temperature=0.0)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def tiny_server(tiny):
    srv = serve_llm(tiny, names=["tiny"], fingerprint="fp-tiny")
    yield srv
    srv.close()


def test_openai_client_matches_the_model_with_logprobs_and_token_ids(tiny, tiny_server):
    want = tiny.complete(MSGS, temperature=0.0, max_tokens=16)
    r = client(tiny_server.url).chat.completions.create(
        model="tiny", messages=MSGS, temperature=0, max_tokens=16, logprobs=True
    )
    ch = r.choices[0]
    assert ch.message.content == want.text and ch.finish_reason == want.finish_reason
    assert ch.model_extra["token_ids"] == list(want.token_ids)
    assert r.model_extra["prompt_token_ids"] == list(want.prompt_token_ids)
    assert [t.logprob for t in ch.logprobs.content] == pytest.approx(list(want.logprobs), abs=1e-5)
    assert "".join(t.token for t in ch.logprobs.content) == want.text  # EOS has no text
    assert r.system_fingerprint == "fp-tiny" and r.model == "tiny"
    assert r.usage.completion_tokens == len(want.token_ids) and r.usage.prompt_tokens == len(want.prompt_token_ids)
    # the list-of-parts content form is the same prompt
    parts = [MSGS[0], {"role": "user", "content": [{"type": "text", "text": "say hi"}]}]
    r2 = client(tiny_server.url).chat.completions.create(model="tiny", messages=parts, temperature=0, max_tokens=16)
    assert r2.choices[0].message.content == want.text
    assert [m.id for m in client(tiny_server.url).models.list().data] == ["tiny"]


def test_top_logprobs_name_the_likeliest_tokens(tiny, tiny_server):
    want = tiny.complete(MSGS, temperature=0.0, max_tokens=8, top_logprobs=3)
    r = client(tiny_server.url).chat.completions.create(
        model="tiny", messages=MSGS, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == len(want.token_ids)
    for entry, step in zip(content, want.top_logprobs):
        assert [t.token for t in entry.top_logprobs] == [tiny.tokenizer.token_text(i) for i, _ in step]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([lp for _, lp in step], abs=1e-5)
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)  # greedy: the token drawn
        assert entry.top_logprobs[0].bytes == list(entry.top_logprobs[0].token.encode())
    bad = [
        ({"top_logprobs": 3}, "needs 'logprobs': true"),
        ({"logprobs": True, "top_logprobs": 21}, "from 0 to 20"),
        ({"logprobs": True, "top_logprobs": "3"}, "from 0 to 20"),
    ]
    for extra, why in bad:
        status, data, _ = raw(
            tiny_server.port,
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "tiny", "messages": MSGS, "max_tokens": 4, **extra}).encode(),
        )
        assert status == 400 and data["error"]["param"] == "top_logprobs" and why in data["error"]["message"]


def test_streaming_and_n(tiny, tiny_server):
    want = tiny.complete(MSGS, temperature=0.0, max_tokens=16)
    stream = client(tiny_server.url).chat.completions.create(
        model="tiny",
        messages=MSGS,
        temperature=0,
        max_tokens=16,
        stream=True,
        logprobs=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want.finish_reason
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)
    r = client(tiny_server.url).chat.completions.create(
        model="tiny", messages=MSGS, n=2, temperature=1.0, seed=3, max_tokens=16
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in r.choices)
    again = client(tiny_server.url).chat.completions.create(
        model="tiny", messages=MSGS, n=2, temperature=1.0, seed=3, max_tokens=16
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]  # seeded


def test_n_choices_are_sampled_in_one_batch_and_each_is_its_seeds_sample():
    from evolve.policy.local import LocalLM
    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model

    cfg = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=128, init_std=0.05)
    llm = LocalLM.from_model(
        build_model(cfg, seed=0),
        CharTokenizer(),
        name="tiny",
        temperature=1.0,
        max_tokens=12,
        batch_wait=0.2,
        max_wait=0.5,
    )
    try:
        alone = [llm.complete(MSGS, temperature=1.0, max_tokens=12, seed=5 + i) for i in range(4)]
        with serve_llm(llm, names=["tiny"]) as srv:
            before = llm.server.stats["batches"]
            r = client(srv.url).chat.completions.create(
                model="tiny", messages=MSGS, n=4, temperature=1.0, seed=5, max_tokens=12
            )
            assert llm.server.stats["batches"] - before == 1  # the four choices in one batch
        assert [c.model_extra["token_ids"] for c in r.choices] == [list(a.token_ids) for a in alone]
    finally:
        llm.close()


def test_litellm_client(tiny, tiny_server):
    litellm = pytest.importorskip("litellm")
    assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == "True"  # set by conftest: no fetch of the cost map
    want = tiny.complete(MSGS, temperature=0.0, max_tokens=16)
    r = litellm.completion(
        model="openai/tiny",
        api_base=tiny_server.url,
        api_key="unused",
        messages=MSGS,
        temperature=0,
        max_tokens=16,
        num_retries=0,
    )
    assert r.choices[0].message.content == want.text


# ----------------------------------------------------------------------------- keys and errors


def test_api_key_is_required_beyond_loopback_and_checked():
    for host in ("0.0.0.0", "192.168.1.7", "example.org", "::"):
        with pytest.raises(ConfigError, match="--api-key.*EVOLVE_SERVE_API_KEY"):
            check_bind(host, None)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_bind(host, None)
    with pytest.raises(ConfigError, match="--api-key"):
        serve_llm(ScriptedLM("echo"), host="0.0.0.0")
    with serve_llm(ScriptedLM("echo"), names=["echo"], api_key="s3cret") as srv:
        with pytest.raises(openai.AuthenticationError):
            client(srv.url, "wrong").chat.completions.create(model="echo", messages=MSGS)
        with pytest.raises(openai.AuthenticationError):
            client(srv.url, "wrong").models.list()
        status, body, _ = raw(srv.port, "GET", "/v1/models")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        r = client(srv.url, "s3cret").chat.completions.create(model="echo", messages=MSGS)
        assert r.choices[0].message.content == "say hi"


class Flaky:
    name = "flaky"

    def complete(self, messages, **kw):
        if messages[-1].content == "fail":
            raise LLMError("model 'flaky': the GPU caught fire")
        return ScriptedLM("flaky").complete(messages, **kw)

    def close(self) -> None:
        pass


def test_errors_have_the_openai_shape_and_keep_the_connection():
    with serve_llm(Flaky(), names=["flaky"]) as srv:
        ok = json.dumps({"model": "flaky", "messages": MSGS}).encode()
        fail = json.dumps({"model": "flaky", "messages": [{"role": "user", "content": "fail"}]}).encode()
        cases = [
            ("POST", "/v1/chat/completions", b"{not json", 400),
            ("POST", "/v1/chat/completions", json.dumps({"model": "flaky"}).encode(), 400),
            (
                "POST",
                "/v1/chat/completions",
                json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
                400,
            ),
            (
                "POST",
                "/v1/chat/completions",
                json.dumps({"model": "flaky", "messages": MSGS, "tools": [{"type": "function"}]}).encode(),
                400,
            ),
            ("POST", "/v1/chat/completions", json.dumps({"messages": MSGS, "temperature": "hot"}).encode(), 400),
            ("POST", "/v1/completions", ok, 404),
            ("GET", "/nowhere", None, 404),
            ("POST", "/v1/chat/completions", json.dumps({"model": "gpt-9", "messages": MSGS}).encode(), 404),
            ("GET", "/v1/chat/completions", None, 405),
            ("POST", "/v1/chat/completions", fail, 500),  # the model raises
            ("POST", "/v1/chat/completions", ok, 200),  # ... and the next call is answered
        ]
        conn = None
        for method, path, body, want in cases:
            status, data, conn = raw(srv.port, method, path, body, conn)
            assert status == want, (path, body, data)
            if want != 200:
                assert set(data["error"]) == {"message", "type", "param", "code"} and data["error"]["message"]
        sock = conn.sock
        status, data, conn = raw(srv.port, "POST", "/v1/chat/completions", ok, conn)
        assert (
            status == 200 and data["choices"][0]["message"]["content"] == "say hi" and conn.sock is sock
        )  # one kept-alive connection for all of it
        # tools are offered in the prompt (evolve.gateway.local); a malformed one is a 400 naming it
        assert "tools[0] must be" in raw(srv.port, "POST", "/v1/chat/completions", cases[3][2])[1]["error"]["message"]
        status, data, _ = raw(
            srv.port,
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "flaky", "messages": MSGS, "response_format": {"type": "json_object"}}).encode(),
        )
        assert status == 400 and data["error"]["param"] == "response_format"  # what a local model cannot honour
        status, data, _ = raw(
            srv.port,
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "flaky", "messages": MSGS, "logprobs": True, "top_logprobs": 2}).encode(),
        )
        assert status == 400 and data["error"]["param"] == "top_logprobs"  # its complete() takes no top_logprobs
        assert "not supported by the model 'flaky'" in data["error"]["message"]
        with pytest.raises(openai.InternalServerError, match="caught fire"):
            client(srv.url).chat.completions.create(model="flaky", messages=[{"role": "user", "content": "fail"}])
        assert (
            client(srv.url).chat.completions.create(model="flaky", messages=MSGS).choices[0].message.content == "say hi"
        )


# ----------------------------------------------------------------------------- serving a run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return two_system_run(tmp_path_factory.mktemp("served"))


def test_hot_swap_on_promotion_and_recording(run_dir):
    from evolve.archive import Archive

    path, a, b = run_dir
    want = greedy_answers(path, (a, b), MSGS)
    assert want[a.id].token_ids != want[b.id].token_ids, "the adapter should change the greedy answer"
    with ServeApp(path, follow=True, poll=0.05, log=lambda m: None) as app:
        srv = app.start()
        base = srv.url.removesuffix("/v1")
        r = client(srv.url).chat.completions.create(model="policy", messages=MSGS, logprobs=True)
        assert r.system_fingerprint == a.id and r.choices[0].message.content == want[a.id].text
        assert [m.id for m in client(srv.url).models.list().data] == ["policy", "tiny", a.id]
        with Archive(path, create=False) as other:  # the engine promotes b, from another connection
            other.set_current(b.id)
        deadline = time.monotonic() + 20
        while app.system_id != b.id and time.monotonic() < deadline:
            time.sleep(0.02)
        r2 = client(base + "/s/alice/v1").chat.completions.create(model="tiny", messages=MSGS, logprobs=True)
        assert r2.system_fingerprint == b.id and r2.choices[0].model_extra["token_ids"] == list(want[b.id].token_ids)
        assert r2.choices[0].message.content == want[b.id].text
        client(base + "/s/alice/v1").chat.completions.create(model="policy", messages=MSGS, n=2)
        with pytest.raises(openai.NotFoundError):  # sessions are routes of their own, tokens are not
            client(base + "/r/sometoken/v1").chat.completions.create(model="policy", messages=MSGS)
        assert [len(app.calls(s)) for s in ("default", "alice")] == [1, 3] and app.sessions() == ["alice", "default"]
        got = app.calls("alice")[0]
        assert got.token_ids == want[b.id].token_ids and got.temperature == 0.0 and got.role == "policy"
        assert got.messages == tuple(Message(**m) for m in MSGS)
    lines = [json.loads(x) for x in (path / "serve" / "calls.jsonl").read_text().splitlines()]
    assert [(x["session"], x["system_id"]) for x in lines] == [("default", a.id)] + [("alice", b.id)] * 3
    calls = [LLMCall.model_validate(x["call"]) for x in lines]
    assert calls[0].token_ids == want[a.id].token_ids and calls[0].prompt_token_ids == want[a.id].prompt_token_ids
    assert calls[0].logprobs == pytest.approx(want[a.id].logprobs, abs=1e-5)
    assert calls[1] == app.calls("alice")[0]


def test_pinned_system_and_bad_role(run_dir):
    path, _, b = run_dir
    with ServeApp(path, system=b.id[:8], follow=True, poll=0.05, log=lambda m: None) as app:
        assert app.pinned and app.system_id == b.id and app._follower is None
    with pytest.raises(UserError, match="no model role 'critic'"):
        ServeApp(path, role="critic")


def test_a_request_in_flight_finishes_on_the_old_system_which_is_closed_after(tmp_path):
    import threading

    from evolve.archive import Archive

    slow = System(
        models={"policy": ModelSpec(backend="scripted", name="m", params={"responses": ["old"], "delay": 0.5})}
    )
    fast = System(models={"policy": ModelSpec(backend="scripted", name="m", params={"responses": ["new"]})})
    with Archive(tmp_path / "run") as archive:
        archive.add_system(slow)
        archive.add_system(fast, parents=[slow.id])
        archive.set_current(slow.id)
    with ServeApp(tmp_path / "run", follow=False, log=lambda m: None) as app:
        url = app.start().url
        old = app._handle
        got = {}
        t = threading.Thread(target=lambda: got.update(r=client(url).chat.completions.create(model="m", messages=MSGS)))
        t.start()
        while not old.refs:  # the request holds the old model
            time.sleep(0.01)
        app.swap_to(fast.id)
        assert not old.llm.closed  # still answering
        assert client(url).chat.completions.create(model="m", messages=MSGS).choices[0].message.content == "new"
        t.join()
        assert got["r"].choices[0].message.content == "old" and got["r"].system_fingerprint == slow.id
        assert old.llm.closed and old.closed and not app._handle.llm.closed
    assert app._handle.llm.closed  # close() closes the served model too


# ----------------------------------------------------------------------------- the CLI


def test_cli_serves_prints_the_url_and_stops_on_ctrl_c(tmp_path):
    from evolve.archive import Archive
    from evolve.cli.commands import main

    with Archive(tmp_path / "run") as archive:
        s = System(models={"policy": ModelSpec(backend="scripted", name="echo", params={"echo": True})})
        archive.add_system(s)
        archive.set_current(s.id)
    with pytest.raises(SystemExit) as e:
        main(["serve", str(tmp_path / "missing")])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["serve", str(tmp_path / "run"), "--host", "0.0.0.0", "--port", "0"])
    assert e.value.code == 2
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EVOLVE_SERVE_API_KEY": "k1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "evolve.cli.commands", "serve", str(tmp_path / "run"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:\d+/v1", line)
        assert m and s.id[:12] in line, line + p.stderr.read() if p.poll() is not None else line
        assert "OpenAI(base_url=" in p.stdout.readline()
        with pytest.raises(openai.AuthenticationError):
            client(m.group(0)).chat.completions.create(model="policy", messages=MSGS)
        r = client(m.group(0), "k1").chat.completions.create(model="echo", messages=MSGS)
        assert r.choices[0].message.content == "say hi" and r.system_fingerprint == s.id
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)  # drains the pipes, so a chatty child cannot block on them
        assert p.returncode == 0, err
    assert json.loads((tmp_path / "run" / "serve" / "calls.jsonl").read_text())["call"]["output"] == "say hi"


def test_evolve_serve_and_gateway_local_are_one_server(tmp_path):
    """`evolve serve RUN_DIR` is the gateway with one local route on the run, as `evolve gateway
    --local RUN_DIR`: the same app answers the same paths, and a bad request gets the same JSON 4xx."""
    pytest.importorskip("starlette")
    from evolve.archive import Archive
    from evolve.gateway import GatewayServer, rollout_route
    from evolve.gateway.app import Gateway, HTTPGateway
    from evolve.gateway.config import from_flags

    with Archive(tmp_path / "run") as archive:
        s = System(models={"policy": ModelSpec(backend="scripted", name="echo", params={"echo": True})})
        archive.add_system(s)
        archive.set_current(s.id)
    chat = {"model": "echo", "messages": MSGS}
    good = [
        ("GET", "/v1/models", None),
        ("GET", "/healthz", None),
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/s/alice/v1/chat/completions", chat),
        ("GET", "/s/alice/v1/models", None),
        ("POST", "/v1/messages", {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ]
    bad = [
        ("POST", "/v1/chat/completions", b"{not json"),
        ("POST", "/v1/chat/completions", {"model": "echo"}),
        ("POST", "/v1/chat/completions", {"messages": MSGS}),
        ("POST", "/v1/chat/completions", {**chat, "temperature": "hot"}),
        ("POST", "/v1/chat/completions", {**chat, "response_format": {"type": "json_object"}}),
        ("POST", "/v1/chat/completions", {**chat, "tools": [{"type": "function"}]}),
        ("POST", "/v1/messages", {"model": "echo", "messages": MSGS}),
        ("GET", "/v1/chat/completions", None),
        ("POST", "/v1/completions", chat),
        ("GET", "/nowhere", None),
        ("POST", "/r/sometoken/v1/chat/completions", chat),
    ]

    def answers(port):
        out = []
        for method, path, body in good + bad:
            data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
            status, got, _ = raw(port, method, path, data)
            out.append((status, got if status >= 400 else sorted(got)))
        return out

    with ServeApp(tmp_path / "run", log=lambda m: None) as app:
        served = app.start()
        with GatewayServer(from_flags(local=tmp_path / "run", store=tmp_path / "traces", port=0)) as gw:
            assert isinstance(served, HTTPGateway) and isinstance(gw, HTTPGateway)
            assert type(served.gateway) is type(gw.gateway) is Gateway
            assert type(served.gateway.routes[0].upstream) is type(gw.gateway.routes[0].upstream)
            mine, theirs = answers(served.port), answers(gw.port)
    assert [st for st, _ in mine[: len(good)]] == [200] * len(good)
    assert [st for st, _ in mine[len(good) :]] == [400, 400, 400, 400, 400, 400, 400, 405, 404, 404, 404]
    assert mine == theirs  # the same answers, the same JSON errors
    assert isinstance(rollout_route.server(), HTTPGateway)  # the rollouts' endpoint: the same server too
    assert [c.output for c in app.calls("alice")] == ["say hi"] and len(app.calls()) == 2  # chat, messages

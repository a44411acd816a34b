"""Keys and retries toward model servers, over real HTTP on loopback: a server named by address
(``api_base``) gets a key only from ``api_key_env``, never one from the environment; a gateway
route's ``max_retries`` means at most ``1 + max_retries`` requests upstream, non-transient errors
are not retried, and a hung upstream is given up after the route's ``timeout``."""

from __future__ import annotations

import time

import pytest

from tests.helpers.servers import FakeOpenAI

pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning")

AMBIENT = {
    "OPENAI_API_KEY": "sk-ambient-openai",
    "ANTHROPIC_API_KEY": "sk-ambient-anthropic",
    "HOSTED_VLLM_API_KEY": "sk-ambient-vllm",
}


@pytest.fixture
def ambient(loopback_env, monkeypatch):
    """Provider keys in the environment, as on a developer's machine."""
    for k, v in AMBIENT.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MY_SERVER_KEY", "sk-mine")


@pytest.fixture
def server(ambient):
    s = FakeOpenAI()
    yield s
    s.close()


def _sent(server) -> str:
    return " ".join(v for h in server.headers for v in h.values())


@pytest.mark.parametrize("model", ["openai/local", "hosted_vllm/local", "anthropic/claude-x"])
def test_a_model_named_by_address_gets_no_ambient_key(server, model):
    from evolve.errors import LLMError
    from evolve.llm.litellm import LiteLLM
    from evolve.types import Message

    try:
        LiteLLM(model, api_base=server.base, max_retries=0).complete([Message(role="user", content="hi")])
    except LLMError:
        pass  # an anthropic client cannot read the server's OpenAI answer; what it sent is what matters
    assert server.headers, "the request did not reach the server"
    assert not any(secret in _sent(server) for secret in AMBIENT.values()), server.headers


def test_a_model_named_by_address_gets_the_key_of_its_api_key_env(server):
    from evolve.llm.litellm import LiteLLM
    from evolve.types import Message

    LiteLLM("openai/local", api_base=server.base, api_key_env="MY_SERVER_KEY", max_retries=0).complete(
        [Message(role="user", content="hi")]
    )
    assert server.headers[-1]["authorization"] == "Bearer sk-mine"


def test_a_judge_model_named_by_address_gets_no_ambient_key(server):
    import json
    import re

    from evolve.gateway.judge import LLMJudge

    def respond(messages):
        nonce = re.search(r'"nonce": "([0-9a-f]+)"', messages[-1]["content"]).group(1)
        return json.dumps({"nonce": nonce, "scores": [{"answer": 1, "score": 1.0, "reason": "ok"}]})

    server.respond = respond
    judge = LLMJudge(
        {"backend": "litellm", "name": "openai/judge", "params": {"api_base": server.base, "max_retries": 0}}
    )
    assert judge({"messages": [{"role": "user", "content": "q"}]}, "a").score == 1.0
    assert not any(secret in _sent(server) for secret in AMBIENT.values()), server.headers


def test_a_gateway_route_named_by_address_gets_no_ambient_key(upstream, tmp_path, ambient):
    with _gateway(upstream, tmp_path) as gw:
        assert _ask(gw, "m") == 200
    assert upstream.headers[-1]["authorization"] == "Bearer EMPTY"


# ----------------------------------------------------------------------------- gateway retries


def _gateway(upstream, tmp_path, **up):
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import GatewayConfig

    cfg = GatewayConfig.model_validate(
        {
            "port": 0,
            "store": tmp_path / "t",
            "routes": [{"name": "r", "upstream": {"model": "openai/*", "api_base": upstream.url, **up}}],
        }
    )
    return GatewayServer(cfg)


def _ask(gw, model: str, stream: bool = False) -> int:
    import openai

    client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0, timeout=60)
    try:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], stream=stream)
        if stream:
            list(r)
        return 200
    except openai.APIStatusError as e:
        return e.status_code


@pytest.mark.parametrize(
    "model,sent,status",
    [
        ("fail-500", 3, 502),
        ("fail-429", 3, 429),  # transient: 1 + max_retries requests
        ("fail-400", 1, 400),
        ("fail-401", 1, 502),
        ("fail-403", 1, 502),
        ("fail-404", 1, 404),
        ("fail-422", 1, 400),
    ],
)
def test_a_route_sends_at_most_one_plus_max_retries_requests_and_never_retries_a_refusal(
    upstream, tmp_path, loopback_env, model, sent, status
):
    with _gateway(upstream, tmp_path, max_retries=2) as gw:
        for stream in (False, True):
            before = len(upstream.requests)
            assert _ask(gw, model, stream) == status
            assert len(upstream.requests) - before == sent, (model, stream)


def test_max_retries_zero_sends_one_request(upstream, tmp_path, loopback_env):
    with _gateway(upstream, tmp_path, max_retries=0) as gw:
        before = len(upstream.requests)
        assert _ask(gw, "fail-500") == 502
        assert len(upstream.requests) - before == 1


def test_a_hung_upstream_is_given_up_after_the_routes_timeout(upstream, tmp_path, loopback_env):
    with _gateway(upstream, tmp_path, max_retries=2, timeout=1.0) as gw:
        for stream in (False, True):
            before, t0 = len(upstream.requests), time.monotonic()
            assert _ask(gw, "slow-4000", stream) == 504
            took = time.monotonic() - t0
            assert 0.9 < took < 2.5, took
            assert len(upstream.requests) - before == 1

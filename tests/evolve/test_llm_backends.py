"""LLM backends: the scripted fake, and litellm for real over HTTP against a loopback
OpenAI-compatible server (retries, non-retryable errors, timeouts, garbage, no internet)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from evolve.errors import ConfigError, LLMError, MissingDependency
from evolve.llm.base import LLM, Completion
from evolve.llm.fake import ScriptedLM
from evolve.llm.fake import build as build_scripted
from evolve.registry import llm_backends
from evolve.types import Message, ModelSpec
from tests.helpers.servers import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
# litellm's lazily imported modules warn about pydantic ReadOnly TypedDicts on first use
pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning")


def user(text: str) -> list[Message]:
    return [Message(role="system", content="be brief"), Message(role="user", content=text)]


# ============================================================================= ScriptedLM


def test_scripted_list_replays_in_order_and_cycles():
    lm = ScriptedLM("s", ["a", "b"])
    assert isinstance(lm, LLM)
    assert [lm.complete(user("x")).text for _ in range(5)] == ["a", "b", "a", "b", "a"]
    assert lm.calls == 5


def test_scripted_list_without_cycle_raises_when_exhausted():
    lm = ScriptedLM("s", ["only"], cycle=False)
    assert lm.complete(user("x")).text == "only"
    with pytest.raises(LLMError, match="ran out of its 1 scripted responses"):
        lm.complete(user("x"))


def test_scripted_list_by_seed_is_order_independent():
    lm = ScriptedLM("s", ["a", "b", "c"], by_seed=True)
    assert [lm.complete(user("x"), seed=s).text for s in (2, 0, 1, 5)] == ["c", "a", "b", "c"]


def test_scripted_dict_matches_a_substring_of_the_last_user_message():
    lm = ScriptedLM("s", {"weather": "sunny", "wea": "never (second key)", "default": "?"})
    assert lm.complete(user("what is the weather like")).text == "sunny"
    assert lm.complete(user("nothing here")).text == "?"
    strict = ScriptedLM("s", {"hello": "hi"})
    with pytest.raises(LLMError, match="no scripted key"):
        strict.complete(user("bye"))


def test_scripted_callable_gets_seed_and_temperature_when_it_accepts_them():
    seen = []

    def reply(messages, seed=None, temperature=None):
        seen.append((seed, temperature))
        return f"{messages[-1].content}:{seed}:{temperature}"

    lm = ScriptedLM("s", reply)
    assert lm.complete(user("q"), seed=3, temperature=0.7).text == "q:3:0.7"
    assert lm.complete(user("q"), seed=3, temperature=0.7).text == lm.complete(user("q"), seed=3, temperature=0.7).text
    assert lm.complete(user("q"), seed=4, temperature=0.7).text != lm.complete(user("q"), seed=3, temperature=0.7).text
    assert ScriptedLM("s", lambda msgs: "plain").complete(user("q"), seed=1).text == "plain"
    assert (
        ScriptedLM("s", lambda msgs, **kw: str(sorted(kw))).complete(user("q")).text
        == "['max_tokens', 'seed', 'stop', 'temperature']"
    )
    full = Completion(text="given", model="m")
    assert ScriptedLM("s", lambda msgs: full).complete(user("q")) is full


def test_scripted_completion_fields():
    lm = ScriptedLM("fake-model", cost_per_call=0.25)
    out = lm.complete(user("héllo there"))  # echo
    assert out.text == "héllo there" and out.model == "fake-model"
    assert out.token_ids == tuple("héllo there".encode()) and out.logprobs == (0.0,) * len(out.token_ids)
    assert out.prompt_token_ids and bytes(out.prompt_token_ids).decode().startswith("system: be brief")
    assert out.completion_tokens == 3 and out.prompt_tokens == (len("be brief") + len("héllo there") + 3) // 4
    assert out.cost == 0.25 and out.finish_reason == "stop"
    bare = ScriptedLM("m", ["abc"], token_ids=False).complete(user("x"))
    assert bare.token_ids is None and bare.logprobs is None and bare.cost is None
    # accepts OpenAI-style dicts too
    assert ScriptedLM("m").complete([{"role": "user", "content": "dict"}]).text == "dict"


def test_scripted_stop_and_max_tokens():
    lm = ScriptedLM("m", ["hello world. more"])
    assert lm.complete(user("x"), stop=["."]).text == "hello world"
    cut = lm.complete(user("x"), max_tokens=5)
    assert cut.text == "hello" and cut.finish_reason == "length" and len(cut.token_ids) == 5


def test_scripted_delay_and_thread_safety():
    lm = ScriptedLM("m", ["a", "b", "c", "d"], delay=0.01)
    t0 = time.perf_counter()
    lm.complete(user("x"))
    assert time.perf_counter() - t0 >= 0.01
    fast = ScriptedLM("m", ["a", "b", "c", "d"])
    outs: list[str] = []

    def hammer():
        for _ in range(1000):
            outs.append(fast.complete(user("x")).text)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fast.calls == 8000 and sorted(set(outs)) == ["a", "b", "c", "d"] and outs.count("a") == 2000


def test_scripted_is_fast():
    lm = ScriptedLM("m", ["the answer is 42"])
    msgs = tuple(user("what is six times seven?"))
    t0 = time.perf_counter()
    for i in range(10_000):
        lm.complete(msgs, seed=i)
    rate = 10_000 / (time.perf_counter() - t0)
    print(f"ScriptedLM: {rate:.0f} completions/s")
    assert rate > 20_000


def test_scripted_build_from_model_spec():
    lm = build_scripted(ModelSpec(backend="scripted", name="adder", params={"reply": "evolve.worlds.toy:reply"}), None)
    msgs = [Message(role="system", content="add carefully"), Message(role="user", content="2 3")]
    assert lm.complete(msgs).text == "5" and lm.name == "adder"
    lm = llm_backends.get("scripted")(
        ModelSpec(
            backend="scripted",
            name="r",
            params={"responses": ["x", "y"], "cost_per_call": 0.5, "temperature": 0.7, "max_tokens": 9},
        ),
        None,
    )
    assert [lm.complete(user("q")).text for _ in range(3)] == ["x", "y", "x"] and lm.cost_per_call == 0.5
    lm = build_scripted(ModelSpec(backend="scripted", name="d", params={"responses": {"q": "dict", "default": "-"}}))
    assert lm.complete(user("q")).text == "dict"
    assert (
        build_scripted(ModelSpec(backend="scripted", name="e", params={"echo": True})).complete(user("hey")).text
        == "hey"
    )
    with pytest.raises(ConfigError, match="did you mean 'responses'"):
        build_scripted(ModelSpec(backend="scripted", name="t", params={"respones": ["a"]}))
    with pytest.raises(ConfigError, match="one of responses, reply or echo"):
        build_scripted(ModelSpec(backend="scripted", name="t", params={"echo": True, "responses": ["a"]}))
    with pytest.raises(Exception, match="no_such_mod"):
        build_scripted(ModelSpec(backend="scripted", name="t", params={"reply": "no_such_mod:f"}))


# ============================================================================= litellm over loopback HTTP


def needs_litellm() -> None:
    import importlib.util

    if importlib.util.find_spec("litellm") is None:
        pytest.skip("litellm is not installed")


@pytest.fixture
def offline_env(monkeypatch):
    """Any request that does not go to loopback goes to a dead proxy (port 9) and fails."""
    needs_litellm()
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(key, "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("EVOLVE_TEST_KEY", "sk-test-SECRET-1234")


@pytest.fixture
def server(offline_env):
    s = FakeOpenAI()
    yield s
    s.close()


def make(server, model="openai/test-model", **kw):
    from evolve.llm.litellm import LiteLLM

    kw.setdefault("api_key_env", "EVOLVE_TEST_KEY")
    kw.setdefault("backoff", 0.01)
    return LiteLLM(model, api_base=server.base, **kw)


def test_litellm_success_usage_and_request(server):
    lm = make(server, top_p=0.9)
    assert isinstance(lm, LLM)
    out = lm.complete(user("hi"), temperature=0.3, max_tokens=20, stop=["\n"], seed=7)
    assert out.text == "hello from loopback" and out.model == "openai/test-model"
    assert out.prompt_tokens == 11 and out.completion_tokens == 4 and out.finish_reason == "stop"
    assert out.cost is None  # a model litellm has no price for: no cost, no crash
    assert out.logprobs is None and out.extra["attempts"] == 1
    (body,) = server.requests
    assert body["model"] == "test-model" and body["messages"][-1] == {"role": "user", "content": "hi"}
    assert body["temperature"] == 0.3 and body["max_tokens"] == 20 and body["seed"] == 7 and body["top_p"] == 0.9
    assert body["stop"] == ["\n"] and "logprobs" not in body
    assert server.headers[0]["authorization"] == "Bearer sk-test-SECRET-1234"


def test_litellm_cost_for_a_priced_model_and_logprobs(server):
    lm = make(server, model="openai/gpt-4o-mini", logprobs=True)
    out = lm.complete(user("hi"))
    assert out.cost is not None and out.cost > 0
    assert out.logprobs == (-0.25, -1.5) and out.extra["tokens"] == ["hello", " from"]
    assert server.requests[0]["logprobs"] is True


def test_litellm_retries_a_500_then_succeeds(server):
    server.script = ["500", "429", "ok"]
    lm = make(server, max_retries=3)
    out = lm.complete(user("hi"))
    assert out.text == "hello from loopback" and out.extra["attempts"] == 3
    assert len(server.requests) == 3 and lm.attempts == 3


def test_litellm_gives_up_after_its_retries(server):
    server.script = ["500"]
    lm = make(server, max_retries=2)
    with pytest.raises(LLMError) as e:
        lm.complete(user("hi"))
    msg = str(e.value)
    assert "openai/test-model" in msg and server.base in msg and "3 attempts" in msg
    assert "InternalServerError" in msg and len(server.requests) == 3


def test_litellm_401_is_not_retried_and_the_key_is_redacted(server):
    server.script = ["401"]
    lm = make(server, max_retries=3)
    with pytest.raises(LLMError) as e:
        lm.complete(user("hi"))
    msg = str(e.value)
    assert len(server.requests) == 1
    assert (
        "openai/test-model" in msg and "1 attempt " in msg and "AuthenticationError" in msg and "not retryable" in msg
    )
    assert "sk-test-SECRET-1234" not in msg and "***" in msg


def test_litellm_404_is_not_retried(server):
    server.script = ["404"]
    with pytest.raises(LLMError, match="NotFoundError"):
        make(server).complete(user("hi"))
    assert len(server.requests) == 1


def test_litellm_hang_past_timeout(server):
    server.script = ["hang"]
    lm = make(server, timeout=0.5, max_retries=1)
    t0 = time.monotonic()
    with pytest.raises(LLMError) as e:
        lm.complete(user("hi"))
    assert time.monotonic() - t0 < 2.5
    assert "2 attempts" in str(e.value) and "Timeout" in str(e.value) and "openai/test-model" in str(e.value)


def test_litellm_garbage_replies(server):
    server.script = ["garbage"]  # not JSON: litellm reports a 500, so it is retried, then fails
    with pytest.raises(LLMError, match="2 attempts"):
        make(server, max_retries=1).complete(user("hi"))
    server.requests.clear()
    server.script = ["empty"]  # valid JSON with no choices: fails at once
    with pytest.raises(LLMError, match="no choices"):
        make(server).complete(user("hi"))
    assert len(server.requests) == 1
    server.script = ["nochoices"]
    with pytest.raises(LLMError):
        make(server, max_retries=0).complete(user("hi"))
    server.script = ["none"]  # content None: empty text, finish_reason kept
    out = make(server).complete(user("hi"))
    assert out.text == "" and out.finish_reason == "content_filter"


def test_litellm_build_from_model_spec_and_registry(server):
    spec = ModelSpec(
        backend="litellm",
        name="openai/test-model",
        params={
            "api_base": server.base,
            "api_key_env": "EVOLVE_TEST_KEY",
            "temperature": 0.2,
            "max_tokens": 8,
            "max_retries": 0,
            "timeout": 5,
            "presence_penalty": 0.5,
        },
    )
    lm = llm_backends.get("litellm")(spec, None)
    lm.complete(user("hi"))
    body = server.requests[0]
    assert body["temperature"] == 0.2 and body["max_tokens"] == 8 and body["presence_penalty"] == 0.5
    lm.close()


def test_litellm_served_model_without_a_key(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    from evolve.llm.litellm import LiteLLM

    out = LiteLLM("openai/local", api_base=server.base, max_retries=0).complete(user("hi"))
    assert out.text == "hello from loopback"


def test_litellm_missing_key_env_is_a_config_error(offline_env, monkeypatch):
    from evolve.llm.litellm import LiteLLM

    monkeypatch.delenv("EVOLVE_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="EVOLVE_NO_SUCH_KEY"):
        LiteLLM("openai/x", api_key_env="EVOLVE_NO_SUCH_KEY")


def test_litellm_retry_classification():
    from evolve.llm.litellm import is_retryable

    class Fake(Exception):
        def __init__(self, code=None):
            super().__init__("x")
            self.status_code = code

    assert is_retryable(Fake(500)) and is_retryable(Fake(503)) and is_retryable(Fake(429)) and is_retryable(Fake(408))
    assert not is_retryable(Fake(400)) and not is_retryable(Fake(401)) and not is_retryable(Fake(404))
    assert is_retryable(TimeoutError()) and is_retryable(ConnectionError()) and not is_retryable(ValueError("x"))
    assert not is_retryable(Fake(500).__class__("Missing credentials. Please pass an api_key"))


def test_litellm_missing_is_a_missing_dependency(monkeypatch):
    import evolve.llm.litellm as mod

    monkeypatch.setattr(mod, "_litellm", None)
    monkeypatch.setitem(sys.modules, "litellm", None)  # import litellm -> ImportError
    with pytest.raises(MissingDependency, match=r"pip install 'evolvekit\[litellm\]'"):
        mod.build(ModelSpec(backend="litellm", name="openai/x"), None)


def test_importing_evolve_does_not_import_litellm():
    code = (
        "import sys, evolve, evolve.runners, evolve.llm.fake, evolve.llm.litellm, evolve.registry; "
        "print('litellm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_litellm_never_reaches_beyond_loopback(tmp_path):
    """In a fresh process with an audit hook on every socket connect and DNS lookup, importing
    litellm through evolve and calling the loopback server touches nothing but loopback."""
    needs_litellm()
    script = textwrap.dedent(f"""
        import sys
        seen = []
        def hook(event, args):
            if event == "socket.connect":
                seen.append(("connect", repr(args[1])))
            elif event == "socket.getaddrinfo":
                seen.append(("dns", str(args[0])))
        sys.addaudithook(hook)
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from tests.evolve.test_llm_backends import FakeOpenAI, user
        from evolve.llm.litellm import LiteLLM
        s = FakeOpenAI()
        out = LiteLLM("openai/test-model", api_base=s.base, max_retries=0).complete(user("hi"))
        assert out.text == "hello from loopback", out
        bad = [x for x in seen if "127.0.0.1" not in x[1] and "localhost" not in x[1]]
        print("SEEN", len(seen), "BAD", bad)
        sys.exit(1 if bad else 0)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_") and "proxy" not in k.lower()}
    env.pop("OPENAI_API_KEY", None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BAD []" in out.stdout
    print(out.stdout.strip())


def test_litellm_rollouts_through_the_thread_runner(server, tmp_path):
    from evolve.runners import RolloutJob, ThreadRunner, WorkerSpec
    from evolve.types import System

    system = System(
        models={
            "policy": ModelSpec(
                backend="litellm",
                name="openai/test-model",
                params={
                    "api_base": server.base,
                    "api_key_env": "EVOLVE_TEST_KEY",
                    "max_retries": 0,
                    "temperature": 0.0,
                },
            )
        }
    )
    spec = WorkerSpec(
        "tests.helpers.agents:one_step", "tests.helpers.agents:exact", str(tmp_path), str(Path(__file__).parents[2])
    )
    js = [
        RolloutJob(f"k{i}", system, {"id": f"t{i}", "q": f"q{i}", "answer": "hello from loopback"}, seed=i)
        for i in range(8)
    ]
    with ThreadRunner(workers=4) as runner:
        out = {j.key: t for j, t in runner.run(spec, js)}
        assert len(out) == 8 and all(t.ok and t.score == 1.0 and t.tokens == 15 for t in out.values())
        assert sorted(r["seed"] for r in server.requests) == [i * 1000 for i in range(8)]
        server.script = ["401"]
        failed = [t for _, t in runner.run(spec, js[:2])]
        assert all(not t.ok and "LLMError" in t.error and "openai/test-model" in t.error for t in failed)

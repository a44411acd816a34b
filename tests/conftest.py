import os
from pathlib import Path

import pytest

# Nothing a test runs may reach outside this machine, and no library may phone home.
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "ANONYMIZED_TELEMETRY": "False",
    "MEM0_TELEMETRY": "False",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}.items():
    os.environ.setdefault(key, value)

# The tests' caches (generated SQL databases, SFT weights) go to a folder of this test run, never to the
# user's ~/.cache/evolvekit; set EVOLVE_CACHE_DIR to reuse a cache across runs.
if not os.environ.get("EVOLVE_CACHE_DIR"):
    import atexit
    import shutil
    import tempfile

    _cache = tempfile.mkdtemp(prefix="evolve-test-cache-")
    os.environ["EVOLVE_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

from tests.helpers import DATA  # noqa: E402


@pytest.fixture
def toy_task() -> Path:
    return DATA / "toy.yaml"


@pytest.fixture
def loopback_env(monkeypatch):
    """For tests that talk to a model server on loopback through litellm: proxies pointed at a dead
    port (so nothing leaves through one), loopback exempt from them, a placeholder key."""
    pytest.importorskip("litellm")
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(key, "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-unused")


@pytest.fixture
def one_torch_thread():
    """One intra-op thread: tiny models gain nothing from two, and a second spinning thread
    makes tests crawl when other processes share the CPU."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _slow_if_it_trains(request):
    """A test that steps an optimizer trains a model: it must be marked slow, so that
    ``-m "not slow"`` trains nothing (the mark is checked, not trusted)."""
    import importlib.util

    if request.node.get_closest_marker("slow") or importlib.util.find_spec("torch") is None:
        yield
        return
    import torch.optim.optimizer as optim

    steps: list[int] = []
    handle = optim.register_optimizer_step_pre_hook(lambda *args, **kwargs: steps.append(1))
    try:
        yield
    finally:
        handle.remove()
    if steps:
        pytest.fail(f"{request.node.nodeid} trains a model ({len(steps)} optimizer steps): mark it @pytest.mark.slow")


@pytest.fixture(scope="session")
def docker_engine():
    """A real Docker engine with the stand-in base images (tests/helpers/docker_engine.py): one that
    answers, or one these tests install and start where the machine allows it (root and apt), stopped
    when they end. What this session ran and built (its label) is removed then, nothing else. Skips
    with the reason where neither is possible; fails instead in CI as root with apt."""
    from tests.helpers import docker_engine as de

    engine, why = de.bring_up()
    if engine is None:
        if de.must_have_engine():
            pytest.fail(f"no Docker engine for the docker tests, in CI as root with apt: {why}")
        pytest.skip(f"no Docker engine for the docker tests: {why}")
    yield engine
    de.tear_down(engine)

"""A key or token that is empty or only whitespace is refused by every server, wherever it binds:
``evolve serve``, ``evolve gateway`` and ``evolve ui`` exit 2 with one message and start nothing
(a key of one space used to start a server beyond loopback). ``evolve mcp``'s own check is tested
in tests/mcp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import evolve
from evolve.errors import ConfigError
from evolve.gateway.asgi import check_bind

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = {"backend": "scripted", "name": "toy", "params": {"reply": "evolve.worlds.toy:reply"}}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("blank") / "toy"
    evolve.run({"world": "toy", "models": {"policy": SCRIPTED}, "budget": {"generations": 0}}, out=out)
    return out


def _evolve(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "evolve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
@pytest.mark.parametrize("blank", ["", " ", "\t \n"])
def test_each_server_refuses_a_blank_secret(run, host, blank):
    cases = [
        (_evolve("serve", str(run), "--host", host, "--port", "0", "--api-key", blank), "is blank"),
        (
            _evolve(
                "gateway", "--upstream", "openai/x", "--host", host, "--port", "0", "--api-key-env", "KEY", KEY=blank
            ),
            "api_key_env",
        ),
        (
            _evolve("ui", str(run), "--host", host, "--port", "0", "--token-env", "TOKEN", TOKEN=blank),
            "--token-env TOKEN",
        ),
    ]
    for r, says in cases:
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (r.args, r.stderr)


def test_the_python_api_refuses_them_too(run):
    from evolve.ui import serve

    for blank in ("", "  "):
        with pytest.raises(ConfigError, match="blank"):
            check_bind("127.0.0.1", blank)
        with pytest.raises(ConfigError, match="blank"):
            serve([run], host="0.0.0.0", token=blank)
    check_bind("0.0.0.0", " k ")  # a key with spaces around it is still a key
    with pytest.raises(ConfigError, match="needs an API key"):
        check_bind("0.0.0.0", None)

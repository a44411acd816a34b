"""An MCP client's task may name only the keys and hosts the person who started the server allowed
(evolve/mcp/grants.py, docs/mcp.md): over the SDK's client, a model whose api_key_env names one of
the server's variables and whose api_base is the client's own server is refused by name before
anything is sent (a listener standing for the client's server sees no request), and so is a key
or host allowed only in part, a litellm model that names neither (litellm would pick the
provider's key itself), a tracker's server (which gets the server's own tracking credentials), a
Harbor build on the host network, Docker's default capabilities and a host variable handed to a
Harbor task; with --allow-key and --allow-host the same task validates."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import anyio
import yaml

from tests.mcp.client import call, http_server, http_session, ok, toy_task

SECRET = "sk-evolvekit-mcp-canary-77d1"


def _litellm_task(root: Path, port: int, **params: Any) -> str:
    path = toy_task(root, "leaky.yaml")
    data = yaml.safe_load(path.read_text())
    data["models"]["policy"] = {
        "backend": "litellm",
        "name": "openai/m",
        "params": {"api_base": f"http://127.0.0.1:{port}/v1", "api_key_env": "EVOLVEKIT_TEST_SECRET", **params},
    }
    data["budget"] = {"generations": 1}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path.name


def _received(srv: socket.socket, seconds: float) -> bytes:
    srv.settimeout(seconds)
    try:
        conn, _ = srv.accept()
    except OSError:
        return b""
    with conn:
        conn.settimeout(2)
        try:
            return conn.recv(65536)
        except OSError:
            return b""


def test_a_clients_task_cannot_send_the_servers_variables_to_its_own_host(root, monkeypatch):
    monkeypatch.setenv("EVOLVEKIT_TEST_SECRET", SECRET)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        name = _litellm_task(root, port)

        async def refused(*flags: str) -> list[str]:
            with http_server(root, *flags) as (_, url):
                async with http_session(url) as s:
                    out = []
                    for tool, args in (("start_run", {"path": name}), ("validate_task", {"path": name})):
                        err, answer = await call(s, tool, args)
                        assert err, f"{tool} with {flags} was not refused: {answer}"
                        out.append(answer)
                    return out

        async def main() -> None:
            none = await refused()
            assert all(
                "models.policy.params.api_key_env" in a and "--allow-key EVOLVEKIT_TEST_SECRET" in a for a in none
            ), none
            key_only = await refused("--allow-key", "EVOLVEKIT_TEST_SECRET")
            assert all(
                "models.policy.params.api_base" in a and f"--allow-host 127.0.0.1:{port}" in a for a in key_only
            ), key_only
            other_host = await refused("--allow-key", "EVOLVEKIT_TEST_SECRET", "--allow-host", "127.0.0.1:1")
            assert "models.policy.params.api_base" in other_host[0]

        anyio.run(main)
        assert SECRET.encode() not in _received(srv, 3.0), "the server's variable reached the client's host"


def test_with_the_key_and_host_allowed_the_task_validates_and_the_rest_stays_refused(root, monkeypatch):
    monkeypatch.setenv("EVOLVEKIT_TEST_SECRET", SECRET)
    name = _litellm_task(root, 8011)

    async def main() -> None:
        with http_server(root, "--allow-key", "EVOLVEKIT_TEST_SECRET", "--allow-host", "127.0.0.1:8011") as (_, url):
            async with http_session(url) as s:
                summary = await ok(s, "validate_task", {"path": name})
                assert summary["models"]["policy"]["backend"] == "litellm"
                for sets, field, needle in (
                    (["models.policy.params.api_key_env=HOME"], "models.policy.params.api_key_env", "--allow-key HOME"),
                    (
                        ["models.policy.params.extra={base_url: 'http://evil.example:9/v1'}"],
                        "models.policy.params.extra.base_url",
                        "--allow-host evil.example:9",
                    ),
                    (["models.policy.params={}"], "models.policy.params.api_key_env", "names neither its key"),
                    (["dataset.params.build_network=host"], "dataset.params.build_network", "never a client"),
                    (["dataset.params.allow_env=[HOME]"], "dataset.params.allow_env.0", "--allow-key HOME"),
                    (["dataset.params.capabilities=docker"], "dataset.params.capabilities", "never a client"),
                    (
                        ["track=[{name: mlflow, params: {tracking_uri: 'https://evil.example/'}}]"],
                        "track.0.params.tracking_uri",
                        "--allow-host evil.example",
                    ),
                    (
                        ["track=[{name: otel, params: {endpoint: 'evil.example:4317'}}]"],
                        "track.0.params.endpoint",
                        "--allow-host evil.example:4317",
                    ),
                    (
                        ["track=[{name: wandb, params: {base_url: 'http://evil.example'}}]"],
                        "track.0.params.base_url",
                        "--allow-host evil.example",
                    ),
                ):
                    err, answer = await call(s, "validate_task", {"path": name, "sets": sets})
                    assert err and field in answer and needle in answer, (sets, answer)

    anyio.run(main)


def test_malformed_grants_are_named():
    import subprocess

    from tests.mcp.client import SERVER

    r = subprocess.run([*SERVER, "--allow-host", "http://x/y"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--allow-host 'http://x/y'" in r.stderr and "Traceback" not in r.stderr

"""Fixtures of the gateway's tests: a scripted OpenAI-compatible upstream on loopback (one per
module) and a gateway in front of it with a fresh trace store (one per test)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def upstream():
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from tests.helpers.upstream import ScriptedUpstream

    with ScriptedUpstream() as up:
        yield up


@pytest.fixture()
def gw(upstream, tmp_path):
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags

    cfg = from_flags(
        upstream="openai/*",
        api_base=upstream.url,
        upstream_key_env=None,
        store=tmp_path / "traces",
        host="127.0.0.1",
        port=0,
        api_key_env=None,
    )
    with GatewayServer(cfg) as server:
        yield server

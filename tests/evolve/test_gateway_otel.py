"""The gateway's calls as OpenTelemetry gen_ai spans, at a real OTLP/gRPC receiver."""

from __future__ import annotations

import time

import pytest

from tests.helpers.otlp import Collector
from tests.helpers.upstream import free_port, post

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def test_calls_become_gen_ai_spans_at_a_real_otlp_collector_live_and_afterwards(upstream, tmp_path, capsys):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    import openai

    from evolve.cli.commands import main
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import from_flags

    with Collector() as col:
        cfg = from_flags(upstream="openai/*", api_base=upstream.url, store=tmp_path / "t", port=0)
        cfg = cfg.model_validate({**cfg.model_dump(), "otel": {"endpoint": col.endpoint}})
        with GatewayServer(cfg) as gw:
            client = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
            r = client.chat.completions.create(
                model="gpt-x", messages=[{"role": "user", "content": "secret words"}], temperature=0.5, user="otel-s"
            )
            with pytest.raises(openai.APIStatusError):
                client.chat.completions.create(model="fail-500", messages=[{"role": "user", "content": "x"}])
        deadline = time.time() + 20
        while len(col.spans) < 2 and time.time() < deadline:
            time.sleep(0.05)
        ok, failed = col.spans[:2]
        a = col.attrs(ok)
        assert (
            ok.name == "chat gpt-x" and a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
        )
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
        assert (
            "secret words" in again["gen_ai.input.messages"] and "echo: secret words" in again["gen_ai.output.messages"]
        )


def test_otel_export_to_a_collector_that_is_not_there_fails_loudly(gw, capsys):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    from evolve.cli.commands import main

    post(gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(SystemExit) as e:
        main(["traces", "otel", str(gw.cfg.store), "--endpoint", f"http://127.0.0.1:{free_port()}"])
    assert e.value.code == 3 and "did not take 1 of 1 spans" in capsys.readouterr().err

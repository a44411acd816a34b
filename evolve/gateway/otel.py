"""The gateway's calls as OpenTelemetry spans, in the ``gen_ai`` semantic conventions, sent to an
OTLP collector (Jaeger, Tempo, Honeycomb, Langfuse, Phoenix, an OpenTelemetry Collector ...).

One span per call, named ``chat <model>``, from the call's start to its end: ``gen_ai.operation.name``
``chat``, ``gen_ai.provider.name`` (from the litellm model's prefix, or ``evolve`` for a local route),
``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.response.id`` (the call id),
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` / ``output_tokens``,
``gen_ai.conversation.id`` (the session), the request's temperature, top_p and max_tokens,
``error.type`` for a failed call, and ``evolve.system.id`` / ``evolve.route``. Message contents are
sent only with ``capture_content`` (``gen_ai.input.messages`` / ``gen_ai.output.messages``, JSON),
as the conventions advise.

Live: ``otel: {endpoint: http://127.0.0.1:4317}`` in gateway.yaml exports each call as it is stored.
Afterwards: ``evolve traces otel STORE --endpoint URL`` sends a store's calls. Needs the
``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-grpc`` packages.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from evolve.gateway.traces import CallRecord


def _provider(call: CallRecord) -> str:
    model = call.upstream_model or ""
    if model.startswith("local:") or (call.params or {}).get("served_by"):
        return "evolve"
    return model.split("/", 1)[0] if "/" in model else call.api


def attributes(call: CallRecord, capture_content: bool = False) -> dict[str, Any]:
    """The span attributes of one call."""
    p = call.params or {}
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": _provider(call),
        "gen_ai.request.model": call.model or "", "gen_ai.response.model": call.upstream_model or "",
        "gen_ai.response.id": call.id, "gen_ai.conversation.id": call.session_id, "evolve.api": call.api,
        "evolve.route": call.route or "", "evolve.call.seq": int(call.seq or 0),
    }
    if call.system_id:
        attrs["evolve.system.id"] = call.system_id
    if call.finish_reason:
        attrs["gen_ai.response.finish_reasons"] = [call.finish_reason]
    for key, name in (("temperature", "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p")):
        if isinstance(p.get(key), (int, float)):
            attrs[name] = float(p[key])
    mt = p.get("max_completion_tokens") or p.get("max_tokens")
    if isinstance(mt, int):
        attrs["gen_ai.request.max_tokens"] = mt
    if call.prompt_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = int(call.prompt_tokens)
    if call.completion_tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = int(call.completion_tokens)
    if call.status != "ok":
        attrs["error.type"] = (call.error or "error").split(":", 1)[0]
    if capture_content:
        attrs["gen_ai.input.messages"] = json.dumps(call.messages, ensure_ascii=False)
        out: dict[str, Any] = {"role": "assistant", "content": call.output}
        if call.tool_calls:
            out["tool_calls"] = call.tool_calls
        attrs["gen_ai.output.messages"] = json.dumps([out], ensure_ascii=False)
        if call.tools:
            attrs["gen_ai.tool.definitions"] = json.dumps(call.tools, ensure_ascii=False)
    return attrs


class _Counted:
    """The exporter, counting the spans whose export failed (the SDK only logs it)."""

    def __init__(self, inner: Any, owner: SpanExport) -> None:
        self.inner, self.owner = inner, owner

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self.inner.export(spans)
        if result != SpanExportResult.SUCCESS:
            self.owner.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class SpanExport:
    """Sends calls as spans through ``exporter`` (an OTLP exporter for ``endpoint`` by default)."""

    def __init__(self, endpoint: str | None = None, *, exporter: Any = None, capture_content: bool = False,
                 service: str = "evolve-gateway", batch: bool = True) -> None:
        from evolve.errors import MissingDependency

        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        except ImportError:
            raise MissingDependency("OpenTelemetry export needs opentelemetry-sdk and "
                                    "opentelemetry-exporter-otlp-proto-grpc; pip install 'evolvekit[otel]'") from None
        if exporter is None:
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            except ImportError:
                raise MissingDependency("OpenTelemetry export needs opentelemetry-exporter-otlp-proto-grpc; "
                                        "pip install 'evolvekit[otel]'") from None
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=bool(endpoint and endpoint.startswith("http://")),
                                        timeout=10)
        self.endpoint = endpoint
        self.failed = 0  # spans the collector did not take
        exporter = _Counted(exporter, self)
        self.capture_content = capture_content
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000) if batch
                                         else SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("evolve.gateway")

    def send(self, calls: Iterable[CallRecord]) -> int:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        n = 0
        for call in calls:
            start = int(call.ts * 1e9)
            end = start + int((call.latency_s or 0.0) * 1e9)
            span = self.tracer.start_span(f"chat {call.model or ''}".strip(), kind=SpanKind.CLIENT, start_time=start,
                                          attributes=attributes(call, self.capture_content))
            if call.status != "ok":
                span.set_status(Status(StatusCode.ERROR, (call.error or "")[:500]))
            span.end(end_time=end)
            n += 1
            if n % 512 == 0:  # the batch queue holds 2048: flush before it would drop spans
                self.provider.force_flush()
        return n

    def close(self) -> None:
        self.provider.force_flush()
        self.provider.shutdown()


__all__ = ["SpanExport", "attributes"]

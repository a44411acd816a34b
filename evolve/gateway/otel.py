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

from collections.abc import Iterable
from typing import Any

from evolve.gateway.traces import CallRecord
from evolve.otel import CountedExporter, chat_attributes, otlp_exporter, require_sdk


def _provider(call: CallRecord) -> str:
    model = call.upstream_model or ""
    if model.startswith("local:") or (call.params or {}).get("served_by"):
        return "evolve"
    return model.split("/", 1)[0] if "/" in model else call.api


def attributes(call: CallRecord, capture_content: bool = False) -> dict[str, Any]:
    """The span attributes of one call (the ``gen_ai`` mapping is :func:`evolve.otel.chat_attributes`)."""
    p = call.params or {}
    attrs = chat_attributes(
        provider=_provider(call),
        request_model=call.model or "",
        response_model=call.upstream_model or "",
        response_id=call.id,
        conversation_id=call.session_id,
        finish_reason=call.finish_reason,
        temperature=p.get("temperature"),
        top_p=p.get("top_p"),
        max_tokens=p.get("max_completion_tokens") or p.get("max_tokens"),
        input_tokens=call.prompt_tokens,
        output_tokens=call.completion_tokens,
        error=None if call.status == "ok" else (call.error or "error"),
        capture_content=capture_content,
        messages=call.messages,
        output=call.output,
        tool_calls=call.tool_calls,
        tools=call.tools,
    )
    attrs.update({"evolve.api": call.api, "evolve.route": call.route or "", "evolve.call.seq": int(call.seq or 0)})
    if call.system_id:
        attrs["evolve.system.id"] = call.system_id
    return attrs


class SpanExport:
    """Sends calls as spans through ``exporter`` (an OTLP exporter for ``endpoint`` by default)."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        exporter: Any = None,
        capture_content: bool = False,
        service: str = "evolve-gateway",
        batch: bool = True,
    ) -> None:
        require_sdk()
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        self.endpoint = endpoint
        self._counted = CountedExporter(exporter if exporter is not None else otlp_exporter(endpoint))
        self.capture_content = capture_content
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        exporter_: Any = self._counted  # a SpanExporter by its methods: the SDK is imported only here
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter_, schedule_delay_millis=1000) if batch else SimpleSpanProcessor(exporter_)
        )
        self.tracer = self.provider.get_tracer("evolve.gateway")

    @property
    def failed(self) -> int:
        """Spans the collector did not take."""
        return self._counted.failed

    def send(self, calls: Iterable[CallRecord]) -> int:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        n = 0
        for call in calls:
            start = int(call.ts * 1e9)
            end = start + int((call.latency_s or 0.0) * 1e9)
            span = self.tracer.start_span(
                f"chat {call.model or ''}".strip(),
                kind=SpanKind.CLIENT,
                start_time=start,
                attributes=attributes(call, self.capture_content),
            )
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

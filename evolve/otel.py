"""OpenTelemetry in the ``gen_ai`` semantic conventions, shared by the gateway (each call it relays,
:mod:`evolve.gateway.otel`) and the ``otel`` tracker (each rollout of a run, :mod:`evolve.trackers.otel`).

:func:`chat_attributes` maps one model call to the attributes of a ``chat <model>`` span:
``gen_ai.operation.name`` ``chat``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.response.model``, ``gen_ai.response.id``, ``gen_ai.response.finish_reasons``,
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``gen_ai.conversation.id``, the request's
temperature, top_p and max_tokens, ``error.type`` for a failed call. Message contents only with
``capture_content`` (``gen_ai.input.messages`` / ``gen_ai.output.messages``, JSON), as the
conventions advise. :func:`tool_attributes` does the same for an ``execute_tool <name>`` span.

:func:`otlp_exporter` builds the OTLP/gRPC span exporter (``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-grpc``: ``pip install 'evolvekit[otel]'``); :class:`CountedExporter`
counts the spans a collector did not take (the SDK only logs them). Nothing here imports
OpenTelemetry at import time.
"""

from __future__ import annotations

import json
from typing import Any

INSTALL = "pip install 'evolvekit[otel]'"


def chat_attributes(
    *,
    provider: str,
    request_model: str,
    response_model: str = "",
    response_id: str | None = None,
    conversation_id: str | None = None,
    finish_reason: str | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    error: str | None = None,
    capture_content: bool = False,
    messages: Any = None,
    output: str | None = None,
    tool_calls: Any = None,
    tools: Any = None,
) -> dict[str, Any]:
    """The ``gen_ai`` attributes of one chat call (see the module docstring)."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": request_model or "",
        "gen_ai.response.model": response_model or "",
    }
    if response_id:
        attrs["gen_ai.response.id"] = response_id
    if conversation_id:
        attrs["gen_ai.conversation.id"] = conversation_id
    if finish_reason:
        attrs["gen_ai.response.finish_reasons"] = [finish_reason]
    for value, name in ((temperature, "gen_ai.request.temperature"), (top_p, "gen_ai.request.top_p")):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs[name] = float(value)
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        attrs["gen_ai.request.max_tokens"] = max_tokens
    if input_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = int(input_tokens)
    if output_tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = int(output_tokens)
    if error is not None:
        attrs["error.type"] = (error or "error").split(":", 1)[0]
    if capture_content:
        attrs["gen_ai.input.messages"] = json.dumps(messages, ensure_ascii=False)
        out: dict[str, Any] = {"role": "assistant", "content": output}
        if tool_calls:
            out["tool_calls"] = tool_calls
        attrs["gen_ai.output.messages"] = json.dumps([out], ensure_ascii=False)
        if tools:
            attrs["gen_ai.tool.definitions"] = json.dumps(tools, ensure_ascii=False)
    return attrs


def tool_attributes(
    *, name: str, error: str | None = None, capture_content: bool = False, arguments: Any = None, result: Any = None
) -> dict[str, Any]:
    """The ``gen_ai`` attributes of one tool call (an ``execute_tool <name>`` span)."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.type": "function",
    }
    if error is not None:
        attrs["error.type"] = (error or "error").split(":", 1)[0][:200]
    if capture_content:
        attrs["gen_ai.tool.call.arguments"] = json.dumps(arguments, ensure_ascii=False, default=str)
        attrs["gen_ai.tool.call.result"] = json.dumps(result, ensure_ascii=False, default=str)
    return attrs


def require_sdk() -> None:
    """Raise :class:`~evolve.errors.MissingDependency` when the OpenTelemetry SDK or its OTLP/gRPC
    exporter is not installed."""
    import importlib.util

    from evolve.errors import MissingDependency

    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.grpc"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise MissingDependency(
                f"OpenTelemetry export needs opentelemetry-sdk and opentelemetry-exporter-otlp-proto-grpc; {INSTALL}"
            )


def otlp_exporter(endpoint: str | None, *, headers: dict[str, str] | None = None, timeout: float = 10) -> Any:
    """An OTLP/gRPC span exporter for ``endpoint`` (``http://`` is sent in the clear, ``https://``
    over TLS; None: the ``OTEL_EXPORTER_OTLP_*`` environment variables decide)."""
    require_sdk()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(
        endpoint=endpoint,
        insecure=bool(endpoint and endpoint.startswith("http://")),
        headers=dict(headers) if headers else None,
        timeout=timeout,
    )


class CountedExporter:
    """A span exporter that counts in ``failed`` the spans whose export failed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failed = 0

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self.inner.export(spans)
        if result != SpanExportResult.SUCCESS:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


__all__ = ["CountedExporter", "INSTALL", "chat_attributes", "otlp_exporter", "require_sdk", "tool_attributes"]

"""OpenTelemetry: every rollout of a run as a trace of ``gen_ai`` spans, sent to an OTLP/gRPC collector.

One trace per stored rollout: a root span ``invoke_agent TASK`` (``gen_ai.operation.name``
``invoke_agent``, ``gen_ai.agent.name`` the task's name, ``gen_ai.agent.id`` the system's id, the
rollout's tokens as ``gen_ai.usage.*``, and ``evolve.system.id``, ``evolve.task.id``,
``evolve.scoring.rollout.key``, ``evolve.split``, ``evolve.phase``, ``evolve.generation``, ``evolve.sample``,
``evolve.score``, ``evolve.reward.<component>``, ``evolve.cost``; an agent that failed sets
``error.type`` and the span's status to ERROR, a reward that failed ``evolve.reward.error``), with a
child span per model call (``chat MODEL``: the gateway's mapping, :func:`evolve.otel.chat_attributes`)
and per tool call (``execute_tool NAME``), in the order the agent made them, each as long as it took.
The archive keeps how long each rollout and step took, not when it ran: a rollout's spans end at
the moment they are sent (live: within the generation that ran it), their durations and order exact.

Contents (messages, outputs, tool arguments and results, reward feedback) only with
``capture_content: true``. How many rollouts of each generation were sent is kept in the archive,
so a failed send is sent again by the next sync, and nothing twice. The resource names the service
(``service``, default ``evolvekit``), the task and the run directory.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.errors import InfraError
from evolve.otel import chat_attributes, otlp_exporter, require_sdk, tool_attributes
from evolve.trackers.base import TrackedRun, TrackerError

CHUNK = 256  # rollouts per export request


class OtelTracker:
    """See the module docstring."""

    name = "otel"
    requires = (("opentelemetry.sdk", "otel"), ("opentelemetry.exporter.otlp.proto.grpc", "otel"))

    class Params(BaseModel):
        model_config = ConfigDict(frozen=True, extra="forbid")
        endpoint: str | None = Field(
            None,
            description="the collector's OTLP/gRPC address, e.g. http://127.0.0.1:4317 "
            "(default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT)",
        )
        headers: dict[str, str] = Field(
            default_factory=dict,
            description="sent with each export (an API key: better in $OTEL_EXPORTER_OTLP_HEADERS, which is read too)",
        )
        capture_content: bool = Field(False, description="send messages, outputs, tool arguments and results")
        service: str = Field("evolvekit", description="the resource's service.name")
        timeout: float = Field(10.0, gt=0, description="seconds to wait for the collector (at start, per export)")

    def __init__(self, **params: Any) -> None:
        self.p = self.Params.model_validate(params)
        self.endpoint = (
            self.p.endpoint
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or ""
        )
        self.address = self.endpoint or "(no endpoint)"
        self._exporter: Any = None
        self._systems: dict[str, Any] = {}

    def open(self) -> None:
        if not self.endpoint:
            raise TrackerError(
                "the otel tracker needs a collector: set track params.endpoint (e.g. "
                "http://127.0.0.1:4317) or OTEL_EXPORTER_OTLP_ENDPOINT"
            )
        require_sdk()
        import grpc

        target = self.endpoint.split("://", 1)[-1].rstrip("/")
        channel = (
            grpc.secure_channel(target, grpc.ssl_channel_credentials())
            if self.endpoint.startswith("https://")
            else grpc.insecure_channel(target)
        )
        try:
            grpc.channel_ready_future(channel).result(timeout=self.p.timeout)
        except grpc.FutureTimeoutError:
            raise TrackerError(
                f"the otel tracker cannot reach the OTLP/gRPC collector at {self.endpoint} within "
                f"{self.p.timeout:g} s; start it or fix track params.endpoint"
            ) from None
        finally:
            channel.close()

    # ------------------------------------------------------------------ sync

    def sync(self, run: TrackedRun) -> str:
        key = f"otel {self.endpoint}"
        state = run.recall(key, {"sent": {}, "closed": 0})
        sent: dict[str, int] = state["sent"]
        rows_done = len(run.generations())
        # Rollouts are filed under the generation that ran them; a generation's are all stored once its
        # row is (generation 0 also holds the final test scoring and `evolve eval`): scan the open ones.
        scan = sorted({0} | set(range(state.get("closed", 0), rows_done + 1)))
        n = 0
        for g in scan:
            rows = run.archive.trajectory_rows(generation=g)
            todo = rows[sent.get(str(g), 0) :]
            for i in range(0, len(todo), CHUNK):
                chunk = todo[i : i + CHUNK]
                self._export(run, chunk)
                sent[str(g)] = sent.get(str(g), 0) + len(chunk)
                n += len(chunk)
                run.remember(key, {"sent": sent, "closed": state.get("closed", 0)})
        state = {"sent": sent, "closed": max(1, rows_done)}
        run.remember(key, state)
        return f"otel to {self.endpoint}: {n} rollouts"

    def _export(self, run: TrackedRun, rows: list[Any]) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import SpanExportResult

        class Collect(SpanProcessor):
            def __init__(self) -> None:
                self.spans: list[Any] = []

            def on_end(self, span: Any) -> None:
                self.spans.append(span)

        collect = Collect()
        provider = TracerProvider(
            resource=Resource.create(
                {
                    "service.name": self.p.service,
                    "evolve.task": run.task_name(),
                    "evolve.run_dir": str(run.run_dir.resolve()),
                }
            )
        )
        provider.add_span_processor(collect)
        tracer = provider.get_tracer("evolve.trackers.otel")
        task_name = run.task_name()
        for row in rows:
            self._rollout(tracer, run, row, task_name)
        if self._exporter is None:
            self._exporter = otlp_exporter(self.endpoint, headers=self.p.headers, timeout=self.p.timeout)
        result = self._exporter.export(collect.spans)
        provider.shutdown()
        if result != SpanExportResult.SUCCESS:
            raise InfraError(
                f"the collector at {self.endpoint} did not take {len(collect.spans)} spans of {len(rows)} rollouts"
            )

    def _rollout(self, tracer: Any, run: TrackedRun, row: Any, task_name: str) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        from evolve.types import LLMCall

        t = row.trajectory
        steps_ns = sum(int(s.duration * 1e9) for s in t.steps)
        end = time.time_ns()
        start = end - max(int(t.duration * 1e9), steps_ns)
        llm = [s for s in t.steps if isinstance(s, LLMCall)]
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": task_name,
            "gen_ai.agent.id": t.system_id,
            "gen_ai.usage.input_tokens": sum(s.prompt_tokens for s in llm),
            "gen_ai.usage.output_tokens": sum(s.completion_tokens for s in llm),
            "evolve.system.id": t.system_id,
            "evolve.task.id": str(t.task_id),
            "evolve.scoring.rollout.key": row.key,
            "evolve.split": row.split,
            "evolve.phase": row.phase,
            "evolve.generation": int(row.generation),
            "evolve.sample": int(t.sample),
            "evolve.score": float(t.score),
            "evolve.tokens": int(t.tokens),
            "evolve.cost": float(t.cost),
            "evolve.duration": float(t.duration),
        }
        if t.reward is not None:
            attrs.update({f"evolve.reward.{k}": float(v) for k, v in t.reward.components.items()})
            if t.reward.error:
                attrs["evolve.reward.error"] = t.reward.error[:500]
            if self.p.capture_content and t.reward.feedback:
                attrs["evolve.reward.feedback"] = t.reward.feedback
        if t.error:
            attrs["error.type"] = t.error.split(":", 1)[0][:200]
        if self.p.capture_content:
            import json

            attrs["evolve.output"] = json.dumps(t.output, ensure_ascii=False, default=str)
        root = tracer.start_span(
            f"invoke_agent {task_name}", kind=SpanKind.INTERNAL, start_time=start, attributes=attrs
        )
        if t.error:
            root.set_status(Status(StatusCode.ERROR, t.error[:500]))
        ctx = trace.set_span_in_context(root)
        at = start
        for step in t.steps:
            took = int(step.duration * 1e9)
            if isinstance(step, LLMCall):
                span = tracer.start_span(
                    f"chat {step.model}",
                    context=ctx,
                    kind=SpanKind.CLIENT,
                    start_time=at,
                    attributes=self._chat(t.system_id, step, run),
                )
            else:
                span = tracer.start_span(
                    f"execute_tool {step.name}",
                    context=ctx,
                    kind=SpanKind.INTERNAL,
                    start_time=at,
                    attributes=tool_attributes(
                        name=step.name,
                        error=step.error,
                        capture_content=self.p.capture_content,
                        arguments=step.args,
                        result=step.result,
                    ),
                )
                if step.error:
                    span.set_status(Status(StatusCode.ERROR, step.error[:500]))
            span.end(end_time=at + took)
            at += took
        root.end(end_time=max(end, at))

    def _chat(self, system_id: str, call: Any, run: TrackedRun) -> dict[str, Any]:
        if system_id not in self._systems:
            try:
                self._systems[system_id] = run.archive.get_system(system_id)
            except Exception:  # noqa: BLE001 - a rollout of a system not archived (none in a run): no provider
                self._systems[system_id] = None
        system = self._systems[system_id]
        spec = system.models.get(call.role) if system is not None else None
        if spec is not None and spec.backend == "litellm" and "/" in spec.name:
            provider = spec.name.split("/", 1)[0]
        else:
            provider = "litellm" if spec is not None and spec.backend == "litellm" else "evolve"
        return {
            **chat_attributes(
                provider=provider,
                request_model=call.model,
                response_model=call.model,
                finish_reason=call.finish_reason,
                temperature=call.temperature,
                input_tokens=call.prompt_tokens,
                output_tokens=call.completion_tokens,
                capture_content=self.p.capture_content,
                messages=[m.model_dump() for m in call.messages],
                output=call.output,
            ),
            "evolve.role": call.role,
            "evolve.cost": float(call.cost or 0.0),
        }

    def close(self, status: str | None) -> None:
        if self._exporter is not None:
            self._exporter.shutdown()
            self._exporter = None


__all__ = ["OtelTracker"]

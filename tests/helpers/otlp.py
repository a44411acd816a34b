"""A real OTLP/gRPC trace receiver on loopback (the collector's own service definition), for the
tests of the gateway's and the otel tracker's spans."""

from __future__ import annotations

import time
from typing import Any


class Collector:
    """``with Collector() as col:`` listens on ``col.endpoint`` and keeps every span it receives in
    ``col.spans``. While ``col.refusing`` is set it answers every export UNAVAILABLE and keeps
    nothing (a collector that is down behind its address, decided per request: no export is
    half taken)."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.spans: list[Any] = []
        self.server: Any = None
        self.refusing = False
        self.refused = 0

    def start(self) -> Collector:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as svc

        outer = self

        class Receiver(svc.TraceServiceServicer):
            def Export(self, request, context):
                if outer.refusing:
                    outer.refused += 1
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the collector is down")
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        outer.spans.extend(ss.spans)
                return pb.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        svc.add_TraceServiceServicer_to_server(Receiver(), self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for(self, n: int, timeout: float = 20) -> None:
        deadline = time.time() + timeout
        while len(self.spans) < n and time.time() < deadline:
            time.sleep(0.05)

    @staticmethod
    def attrs(span: Any) -> dict:
        out = {}
        for kv in span.attributes:
            v = kv.value
            kind = v.WhichOneof("value")
            out[kv.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
        return out

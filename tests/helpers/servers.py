"""Servers the tests talk to over loopback: a small OpenAI-compatible chat-completions server that
can misbehave on cue, and be stopped and started again on the same port (an outage)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAI:
    """A tiny OpenAI-compatible /v1/chat/completions server on 127.0.0.1 (random port).

    ``script`` lists what to do for successive requests (the last entry repeats):
    ok | 500 | 429 | 401 | 404 | hang | garbage | empty | none | nochoices.
    """

    def __init__(self, port: int = 0, respond: Callable[[list[dict]], str] | None = None) -> None:
        self.script: list[str] = ["ok"]
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.reply = "hello from loopback"
        self.respond = respond  # messages -> reply text (else self.reply)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                server.requests.append(body)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                i = len(server.requests) - 1
                what = server.script[min(i, len(server.script) - 1)]
                if what == "hang":
                    time.sleep(3)
                    what = "ok"
                if what in ("500", "429", "401", "404"):
                    key = server.headers[-1].get("authorization", "")
                    return self.send(
                        int(what), {"error": {"message": f"scripted {what}; got key {key}", "type": "x", "code": what}}
                    )
                if what == "garbage":
                    return self.send(200, b"<html>this is {not json")
                text = server.respond(body.get("messages") or []) if server.respond else server.reply
                choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                if what == "none":
                    choice["message"]["content"] = None
                    choice["finish_reason"] = "content_filter"
                if body.get("logprobs"):
                    choice["logprobs"] = {
                        "content": [
                            {"token": "hello", "logprob": -0.25, "bytes": None, "top_logprobs": []},
                            {"token": " from", "logprob": -1.5, "bytes": None, "top_logprobs": []},
                        ]
                    }
                resp = {
                    "id": "cmpl-1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": body.get("model", "?"),
                    "choices": [] if what == "empty" else [choice],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15},
                }
                if what == "nochoices":
                    resp.pop("choices")
                return self.send(200, resp)

            def send(self, code, payload):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._handler = Handler
        self.httpd = None
        self.port = port
        self.start()

    def start(self) -> FakeOpenAI:
        """Listen (again) on the same port: a server that was down is back."""
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop listening: connections to the port are refused until :meth:`start`."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


def toy_reply(messages: list[dict]) -> str:
    """The toy world's scripted model (:func:`evolve.worlds.toy.reply`) behind HTTP."""
    from evolve.types import Message
    from evolve.worlds.toy import reply

    return reply(tuple(Message(role=m["role"], content=m["content"]) for m in messages))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

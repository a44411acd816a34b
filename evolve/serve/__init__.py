"""``evolve serve``: a system's model behind an OpenAI-compatible chat-completions endpoint.

Two ways in:

* :class:`ServeApp` (the ``evolve serve RUN_DIR`` command) serves one role of a run's current
  system, hot-swaps it when the archive promotes another, and records every call with its
  token ids and log-probs in ``RUN_DIR/serve/calls.jsonl``;
* the rollout gateway (:meth:`evolve.rollout.RolloutContext.openai_base_url`) gives each
  rollout its own URL, so an unmodified agent that speaks the OpenAI API (directly or through
  litellm) has its calls recorded in its trajectory and can be trained.

Only the standard library is used (``http.server``); nothing here is imported by ``import evolve``.
:class:`evolve.serve.asgi.ASGIServer` runs the gateway's and the dashboard's Starlette apps under uvicorn.
"""

from evolve.serve.app import ServeApp
from evolve.serve.protocol import APIError, ChatRequest, parse_chat_request
from evolve.serve.server import LLMTarget, OpenAIServer, check_bind, serve_llm

__all__ = ["APIError", "ChatRequest", "LLMTarget", "OpenAIServer", "ServeApp", "check_bind", "parse_chat_request",
           "serve_llm"]

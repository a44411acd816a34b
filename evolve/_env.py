"""Phone-home switches for the libraries evolvekit drives. Called by the CLI and by each heavy
backend just before it imports its library; never at ``import evolve``. Only sets defaults:
a user's explicit environment wins."""

from __future__ import annotations

import os

QUIET = {
    "HF_HUB_OFFLINE": "1",  # transformers / sentence-transformers: never fetch from the hub
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm: use the bundled price map, do not download it
    "ANONYMIZED_TELEMETRY": "False",  # chromadb
    "MEM0_TELEMETRY": "False",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",  # the OpenAI Agents SDK: do not export traces to OpenAI
    "LANGSMITH_TRACING": "false",  # LangChain / LangGraph: no LangSmith traces
    "LANGCHAIN_TRACING_V2": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",  # MLflow's usage telemetry (it reads DO_NOT_TRACK only as "true")
}


def quiet_defaults() -> None:
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)

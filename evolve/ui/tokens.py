"""The text of each sampled token of a local model's call, so the trajectory viewer can colour
tokens by their log-probability.

A tiny base stores its tokenizer in the weights file's metadata (:mod:`evolve.policy.weights`);
it is read without loading the tensors (safetensors' metadata, numpy framework: no torch). The
pointer tokenizer's pointers decode against the call's messages, so each token's text is the
difference between the decoded prefixes. Pretrained bases (a manifest) and hosted models are
left out: their calls show the output text and, when recorded, the log-probs as numbers.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from evolve.ui.run import RunView

MAX_TOKENS = 4096


@functools.lru_cache(maxsize=16)
def _tokenizer(path: str) -> Any:
    from safetensors import safe_open

    from evolve.policy.pointer import tokenizer_from_dict
    from evolve.policy.weights import META_KEY

    with safe_open(path, framework="numpy") as f:
        meta = json.loads((f.metadata() or {})[META_KEY])
    return tokenizer_from_dict(meta["tokenizer"])


def tokenizer_for(run: RunView, system_id: str, role: str) -> Any | None:
    try:
        spec = run.archive.get_system(system_id).models.get(role)
    except Exception:  # noqa: BLE001 - a system this run does not hold: nothing to decode with
        return None
    if spec is None or spec.backend != "local" or spec.base is None or spec.base.kind != "base_weights":
        return None
    path = run.archive.artifacts.path(spec.base)
    if not path.is_file():
        return None
    try:
        return _tokenizer(str(path))
    except Exception:  # noqa: BLE001 - not a tiny base (a manifest, a foreign file): no token texts
        return None


def token_texts(run: RunView, traj: dict[str, Any]) -> dict[int, list[str]]:
    """``step index -> the text of each sampled token`` for the model calls that recorded token ids."""
    out: dict[int, list[str]] = {}
    for i, step in enumerate(traj.get("steps") or []):
        ids = step.get("token_ids")
        if step.get("kind") != "llm" or not ids:
            continue
        tok = tokenizer_for(run, traj.get("system_id", ""), step.get("role", ""))
        if tok is None:
            continue
        context = step.get("messages") or []
        ids = list(ids)[:MAX_TOKENS]
        texts, before = [], ""
        for k in range(1, len(ids) + 1):
            now = tok.decode(ids[:k], context)
            texts.append(now[len(before):] if now.startswith(before) else tok.decode(ids[k - 1:k], context))
            before = now
        out[i] = texts
    return out

"""The text of each sampled token of a local model's call, so the trajectory viewer can colour
tokens by their log-probability: the weights layer decodes them with the tokenizer a tiny base
stores in its weights file (:data:`evolve.registry.views` ``tokens``), without torch. Pretrained
bases (a manifest) and hosted models are left out: their calls show the output text and the mean
log-prob."""

from __future__ import annotations

from typing import Any

from evolve.ui.run import RunView

MAX_TOKENS = 4096


def base_file(run: RunView, system_id: str, role: str) -> str | None:
    """The tiny base weights file of the system's model for ``role``, when it is a local model here."""
    try:
        spec = run.archive.get_system(system_id).models.get(role)
    except Exception:  # noqa: BLE001 - a system this run does not hold: nothing to decode with
        return None
    if spec is None or spec.backend != "local" or spec.base is None or spec.base.kind != "base_weights":
        return None
    if not run.archive.artifacts.has(spec.base.sha256):  # a run copied without its artifacts/
        return None
    return str(run.archive.artifacts.path(spec.base))


def token_texts(run: RunView, traj: dict[str, Any]) -> dict[int, list[str]]:
    """``step index -> the text of each sampled token`` for the model calls that recorded token ids."""
    from evolve.registry import views

    decode = views.get("tokens")
    out: dict[int, list[str]] = {}
    for i, step in enumerate(traj.get("steps") or []):
        ids = step.get("token_ids")
        if step.get("kind") != "llm" or not ids:
            continue
        path = base_file(run, traj.get("system_id", ""), step.get("role", ""))
        texts = decode(path, list(ids)[:MAX_TOKENS], step.get("messages") or []) if path else None
        if texts is not None:
            out[i] = texts
    return out

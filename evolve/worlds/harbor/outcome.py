"""What a Harbor task's environment reports back, whichever backend ran it: the error that is
the world failing (:class:`EnvironmentError_`) and the verdict of the task's tests (its reward file
by Harbor's rules, see :mod:`.environment`)."""

from __future__ import annotations

import json
import math
from typing import Any

from evolve.errors import InfraError

FEEDBACK_CHARS = 4000
TEXT_LIMIT = 1 << 20  # bytes read of a Dockerfile or a reward file


class EnvironmentError_(InfraError):  # noqa: N801 - not the builtin EnvironmentError
    """The task's environment failed (could not be built, a test that never finished, a reward
    that is not a number): the world failing under the rollout, not the agent. ``status``: what
    ``evolve harbor check`` calls the task when this happens before a run: ``broken``, or
    ``unsupported`` when this backend cannot carry the task out (the message names the one that can);
    ``reason``: the message without the task's id."""

    def __init__(self, task: dict, message: str, *, status: str = "broken") -> None:
        super().__init__(f"Harbor task {task.get('id')}: {message}", category="environment", retryable=False)
        self.status, self.reason = status, message


def unsupported(task: dict, message: str) -> EnvironmentError_:
    """This backend cannot carry the task out: ``unsupported``, naming the docker backend."""
    return EnvironmentError_(task, f"{message}; use the docker backend (dataset.params.environment: docker)",
                             status="unsupported")


def tail(text: str, n: int = FEEDBACK_CHARS) -> str:
    return text if len(text) <= n else "…" + text[-n:]


def parse_reward(task: dict, reward_json: bytes | None, reward_txt: bytes | None, exit_code: int | None) -> tuple[float, dict, str]:
    """(score, components, where it came from) by Harbor's rules (see :mod:`.environment`)."""
    if reward_json is not None:
        try:
            data = json.loads(reward_json.decode("utf-8", "replace") or "null")
        except json.JSONDecodeError as e:
            raise EnvironmentError_(task, f"/logs/verifier/reward.json is not JSON ({e}); fix tests/test.sh") from None
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            data = {"reward": data}
        if not isinstance(data, dict) or not data or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in data.values()):
            raise EnvironmentError_(task, f"/logs/verifier/reward.json must map names to numbers, got {str(data)[:200]}")
        comps = {str(k): float(v) for k, v in data.items()}
        score = comps.get("reward", sum(comps.values()) / len(comps))
        return score, comps, "reward.json"
    if reward_txt is not None:
        text = reward_txt.decode("utf-8", "replace").strip()
        try:
            score = float(text)
        except ValueError:
            raise EnvironmentError_(task, f"/logs/verifier/reward.txt holds {text[:80]!r}, not a number; fix "
                                    "tests/test.sh") from None
        if not math.isfinite(score):
            raise EnvironmentError_(task, f"/logs/verifier/reward.txt holds {text!r}")
        return score, {}, "reward.txt"
    return (1.0 if exit_code == 0 else 0.0), {}, "exit code"


def verdict(task: dict, r: Any, reward_json: bytes | None, reward_txt: bytes | None, seconds: float) -> dict:
    """The tests' verdict (``score, components, source, exit_code, output, seconds``) from their
    command's result and the reward files read back."""
    if r.timed_out:
        raise EnvironmentError_(task, f"tests/test.sh did not finish within the verifier's timeout_sec "
                                f"({task['verifier_timeout']:g} s) and was killed; give the test its own timeouts")
    score, comps, source = parse_reward(task, reward_json, reward_txt, r.exit_code)
    output = (r.stdout + ("\n" + r.stderr if r.stderr.strip() else "")).strip()
    return {"score": score, "components": comps, "source": source, "exit_code": r.exit_code,
            "output": tail(output), "seconds": round(seconds, 3)}


__all__ = ["FEEDBACK_CHARS", "TEXT_LIMIT", "EnvironmentError_", "parse_reward", "tail", "unsupported", "verdict"]

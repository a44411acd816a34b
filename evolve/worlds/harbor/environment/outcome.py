"""What a Harbor task's environment reports back, whichever backend ran it: the error that is
the world failing (:class:`EnvironmentError_`) and the verdict of the task's tests (its reward file
by Harbor's rules, see :mod:`evolve.worlds.harbor.environment`)."""

from __future__ import annotations

import json
import math
from typing import Any

from evolve.errors import InfraError

FEEDBACK_CHARS = 4000
TEXT_LIMIT = 1 << 20  # bytes read of a Dockerfile or a reward file


class EnvironmentError_(InfraError):  # noqa: N801 - not the builtin EnvironmentError
    """The task's environment failed (could not be built, a test that never finished, no reward
    file or one that is not a number): the world failing under the rollout, not the agent.
    ``status``: what ``evolve harbor check`` calls the task when this happens before a run:
    ``broken``, or ``unsupported`` when this backend or machine cannot carry the task out (the
    message names what can); ``reason``: the message without the task's id; ``kind``: the type of
    the exception Harbor's trial result would record (``RewardFileNotFoundError``,
    ``VerifierTimeoutError``, ...)."""

    def __init__(self, task: dict, message: str, *, status: str = "broken", kind: str = "RuntimeError") -> None:
        super().__init__(f"Harbor task {task.get('id')}: {message}", category="environment", retryable=False)
        self.status, self.reason, self.kind, self.task_id = status, message, kind, task.get("id")

    def __reduce__(self):  # a process worker sends it back whole
        return (_environment_error, (self.task_id, self.reason, self.status, self.kind))


def _environment_error(task_id: Any, reason: str, status: str, kind: str) -> EnvironmentError_:
    return EnvironmentError_({"id": task_id}, reason, status=status, kind=kind)


def unsupported(task: dict, message: str) -> EnvironmentError_:
    """This backend cannot carry the task out: ``unsupported``, naming the docker backend."""
    return EnvironmentError_(
        task,
        f"{message}; use the docker backend (dataset.params.environment: docker)",
        status="unsupported",
        kind="Unsupported",
    )


def tail(text: str, n: int = FEEDBACK_CHARS) -> str:
    return text if len(text) <= n else "…" + text[-n:]


def _parse_error(task: dict, message: str) -> EnvironmentError_:
    return EnvironmentError_(task, message + "; fix tests/test.sh", kind="VerifierOutputParseError")


def rewards_of(task: dict, reward_json: bytes | None, reward_txt: bytes | None) -> tuple[dict[str, float], str]:
    """The rewards as Harbor's verifier reads them: ``/logs/verifier/reward.json`` (an object of
    numbers, every key kept) before ``reward.txt`` (one number, as ``{"reward": x}``). No reward
    file is the verifier failing (``RewardFileNotFoundError``), never a score by exit code."""
    if reward_json is not None:
        if not reward_json:
            raise EnvironmentError_(
                task, "/logs/verifier/reward.json is empty; fix tests/test.sh", kind="RewardFileEmptyError"
            )
        try:
            data = json.loads(reward_json.decode("utf-8", "replace"))
        except json.JSONDecodeError as e:
            raise _parse_error(task, f"/logs/verifier/reward.json is not JSON ({e})") from None
        if not isinstance(data, dict):
            raise _parse_error(
                task, f"/logs/verifier/reward.json must be an object mapping names to numbers, got {str(data)[:200]}"
            )
        bad = [k for k, v in data.items() if not isinstance(v, (int, float)) or not math.isfinite(float(v))]
        if bad or not data:
            raise _parse_error(
                task, f"/logs/verifier/reward.json must map names to finite numbers, got {str(data)[:200]}"
            )
        return {str(k): float(v) for k, v in data.items()}, "reward.json"
    if reward_txt is not None:
        if not reward_txt:
            raise EnvironmentError_(
                task, "/logs/verifier/reward.txt is empty; fix tests/test.sh", kind="RewardFileEmptyError"
            )
        text = reward_txt.decode("utf-8", "replace")
        try:
            value = float(text)
        except ValueError:
            raise _parse_error(task, f"/logs/verifier/reward.txt holds {text.strip()[:80]!r}, not a number") from None
        if not math.isfinite(value):
            raise _parse_error(task, f"/logs/verifier/reward.txt holds {text.strip()!r}")
        return {"reward": value}, "reward.txt"
    raise EnvironmentError_(
        task,
        "tests/test.sh wrote no reward file (/logs/verifier/reward.txt or reward.json): "
        "the verifier failed (Harbor's RewardFileNotFoundError), so the episode is not scored",
        kind="RewardFileNotFoundError",
    )


def primary(rewards: dict[str, float]) -> tuple[float, str]:
    """The one score of ``rewards``: its ``reward`` key, else its only value (Harbor's primary
    reward); with several keys and no ``reward`` (Harbor names none: its metric averages each key
    apart), their mean, and the source says so."""
    if "reward" in rewards:
        return rewards["reward"], ""
    if len(rewards) == 1:
        return next(iter(rewards.values())), ""
    return sum(rewards.values()) / len(rewards), f" (no 'reward' key: the mean of its {len(rewards)} keys)"


def parse_reward(task: dict, reward_json: bytes | None, reward_txt: bytes | None) -> tuple[float, dict, str]:
    """(score, components: every key of the rewards, where it came from) by Harbor's rules."""
    rewards, source = rewards_of(task, reward_json, reward_txt)
    score, how = primary(rewards)
    return score, rewards, source + how


def verdict(
    task: dict,
    r: Any,
    reward_json: bytes | None,
    reward_txt: bytes | None,
    seconds: float,
    output: str | None = None,
    timeout: float | None = None,
) -> dict:
    """The tests' verdict (``score, components, source, exit_code, output, seconds``) from their
    command's result, the reward files read back and the tests' output (``output``, else the
    command's own)."""
    if r.timed_out:
        raise EnvironmentError_(
            task,
            f"tests/test.sh did not finish within the verifier's timeout_sec "
            f"({timeout or task['verifier_timeout']:g} s) and was killed; give the test its own "
            "timeouts",
            kind="VerifierTimeoutError",
        )
    if output is None:
        output = r.stdout + ("\n" + r.stderr if r.stderr.strip() else "")
    try:
        score, comps, source = parse_reward(task, reward_json, reward_txt)
    except EnvironmentError_ as e:
        shown = tail(output.strip(), 1500)
        if not shown:
            raise
        raise EnvironmentError_(task, f"{e.reason}. Its output: {shown}", status=e.status, kind=e.kind) from None
    return {
        "score": score,
        "components": comps,
        "source": source,
        "exit_code": r.exit_code,
        "output": tail(output.strip()),
        "seconds": round(seconds, 3),
    }


def aggregate(task: dict, steps: list[dict]) -> dict:
    """A multi-step episode's verdict from its steps' (Harbor's ``multi_step_reward_strategy``):
    ``mean`` (the default) each key's mean over the steps the verifier ran (a key a step lacks
    counts 0; a step that failed before its agent, with no rewards, is left out), ``final`` the
    last step's: none when that step failed before its agent, which Harbor's trial records as no
    reward and its metrics count 0 (here: score 0.0, no components)."""
    strategy = task.get("multi_step_reward_strategy") or "mean"
    verified = [s for s in steps if "components" in s]
    if not verified or (strategy == "final" and "components" not in steps[-1]):
        score, comps, how = 0.0, {}, f" (step {steps[-1]['step']!r} has no rewards: Harbor's reward is none, counted 0)"
    else:
        if strategy == "final":
            comps = dict(steps[-1]["components"])
        else:
            keys = sorted({k for s in verified for k in s["components"]})
            comps = {k: sum(s["components"].get(k, 0.0) for s in verified) / len(verified) for k in keys}
        score, how = primary(comps)
    left = len(steps) - len(verified)
    return {
        "score": score,
        "components": comps,
        "source": f"{len(verified)} step(s) verified"
        f"{f', {left} failed before its agent' if left else ''}, {strategy}{how}",
        "exit_code": verified[-1]["exit_code"] if verified else None,
        "output": tail(
            "\n".join(
                f"[{s['step']}] {s['output'] if 'output' in s else s['failed'] + ' failed: ' + s['reason']}"
                for s in steps
            )
        ),
        "seconds": round(sum(s.get("seconds", 0.0) for s in steps), 3),
        "steps": steps,
    }


__all__ = [
    "FEEDBACK_CHARS",
    "TEXT_LIMIT",
    "EnvironmentError_",
    "aggregate",
    "parse_reward",
    "primary",
    "rewards_of",
    "tail",
    "unsupported",
    "verdict",
]

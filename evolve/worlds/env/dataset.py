"""The env world's dataset: episodes of one environment, each a seed.

A task is ``reset(seed=N)`` of the environment, so the splits are disjoint sets of seeds, fixed by
the task file alone (the run's seed moves nothing): by default ``episodes: {train: 24, val: 8,
test: 16}`` takes seeds 0–23 for train, 24–31 for val and 32–47 for test (``first_seed`` shifts
them), or ``seeds: {train: [...], val: [...], test: [...]}`` lists them. Before the run the server
is asked once (a reset of the first training seed): a server that is down or does not speak the
protocol stops the run there, with the URL and what was wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evolve.errors import ConfigError, InfraError

SPLITS = ("train", "val", "test")
FORMATS = ("text", "json")
SCORES = ("return", "last", "max")
DEFAULT_EPISODES = {"train": 24, "val": 8, "test": 16}


def _seeds(episodes: Any, seeds: Any, first_seed: Any) -> dict[str, list[int]]:
    if seeds is not None:
        if not isinstance(seeds, dict) or set(seeds) - set(SPLITS):
            raise ConfigError(
                f"seeds must map {list(SPLITS)} to lists of non-negative integers, got {seeds!r}",
                path="dataset.params.seeds",
            )
        out = {}
        for name in SPLITS:
            got = seeds.get(name) or []
            if not isinstance(got, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in got
            ):
                raise ConfigError(
                    f"seeds.{name} must be a list of non-negative integers, got {got!r}", path="dataset.params.seeds"
                )
            out[name] = list(dict.fromkeys(got))
        shared = sorted(
            (set(out["train"]) & set(out["val"]))
            | (set(out["train"]) & set(out["test"]))
            | (set(out["val"]) & set(out["test"]))
        )
        if shared:
            raise ConfigError(
                f"seed {shared[0]} is in more than one split; each episode belongs to one", path="dataset.params.seeds"
            )
        return out
    counts = {**DEFAULT_EPISODES, **(episodes or {})} if isinstance(episodes, (dict, type(None))) else None
    if (
        counts is None
        or set(counts) - set(SPLITS)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values())
    ):
        raise ConfigError(
            f"episodes must map {list(SPLITS)} to counts (non-negative integers), got {episodes!r}",
            path="dataset.params.episodes",
        )
    if isinstance(first_seed, bool) or not isinstance(first_seed, int) or first_seed < 0:
        raise ConfigError(
            f"first_seed must be a non-negative integer, got {first_seed!r}", path="dataset.params.first_seed"
        )
    out, start = {}, first_seed
    for name in SPLITS:
        out[name] = list(range(start, start + counts[name]))
        start += counts[name]
    return out


def _action(action: Any) -> dict:
    if action is None:
        return {"format": "text", "key": "message"}
    if isinstance(action, str):
        action = {"format": action}
    if not isinstance(action, dict) or set(action) - {"format", "key"} or action.get("format", "text") not in FORMATS:
        raise ConfigError(
            f"action must be {{format: text, key: FIELD}} or {{format: json}}, got {action!r}",
            path="dataset.params.action",
        )
    out = {"format": action.get("format", "text")}
    if out["format"] == "text":
        key = action.get("key", "message")
        if not isinstance(key, str) or not key:
            raise ConfigError(
                f"action.key must name the action's text field, got {key!r}", path="dataset.params.action.key"
            )
        out["key"] = key
    elif "key" in action:
        raise ConfigError(
            "action.key goes with format: text (a JSON reply is the whole action)", path="dataset.params.action"
        )
    return out


def dataset(
    seed: int = 0,
    url: str | None = None,
    server: str | None = None,
    base_dir: Path | None = None,
    transport: str = "auto",
    episodes: dict | None = None,
    seeds: dict | None = None,
    first_seed: int = 0,
    reset: dict | None = None,
    action: Any = None,
    observation_key: str | None = None,
    score: str = "return",
    timeout: float = 30.0,
    check: bool = True,
) -> dict[str, list[dict]]:
    """``{"train", "val", "test"}`` lists of episodes (see the module docstring). ``url``: a running
    server; ``server``: ``"module:app"``, an ASGI app started on loopback (a module beside the task
    file works); ``transport``: ``auto`` | ``ws`` | ``http``; ``reset``: more ``reset`` parameters;
    ``action``: how a reply becomes an action; ``observation_key``: the observation's text field;
    ``score``: ``return`` (the sum of the episode's rewards), ``last`` or ``max``; ``timeout``:
    seconds per request; ``check``: ask the server once before the run."""
    from evolve.worlds.env.client import TRANSPORTS, check_url, connect
    from evolve.worlds.env.launch import load_app, serve

    if (url is None) == (server is None):
        raise ConfigError(
            "the env world needs its environment: dataset.params.url (a running server, "
            "'http://127.0.0.1:8000') or dataset.params.server (an ASGI app, 'wordgame:app'), "
            "one of the two",
            path="dataset.params",
        )
    if transport not in TRANSPORTS:
        raise ConfigError(f"transport {transport!r} is not one of {list(TRANSPORTS)}", path="dataset.params.transport")
    if score not in SCORES:
        raise ConfigError(f"score {score!r} is not one of {list(SCORES)}", path="dataset.params.score")
    if reset is not None and not isinstance(reset, dict):
        raise ConfigError(f"reset must be a mapping of reset parameters, got {reset!r}", path="dataset.params.reset")
    if "seed" in (reset or {}):
        raise ConfigError(
            "reset.seed is each episode's own (the splits' seeds); leave it out", path="dataset.params.reset"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise ConfigError(f"timeout must be seconds in (0, 3600], got {timeout!r}", path="dataset.params.timeout")
    if observation_key is not None and not isinstance(observation_key, str):
        raise ConfigError(
            f"observation_key must be a field name, got {observation_key!r}", path="dataset.params.observation_key"
        )
    search = str(base_dir) if base_dir is not None else None
    env: dict[str, Any] = {
        "transport": transport,
        "reset": dict(reset or {}),
        "action": _action(action),
        "observation_key": observation_key,
        "score": score,
        "timeout": float(timeout),
    }
    if url is not None:
        env["url"] = check_url(url)
    else:
        load_app(server, search)  # a bad import path is the user's to fix, before anything runs
        env["server"], env["search"] = server, search
    splits = _seeds(episodes, seeds, first_seed)
    if not splits["train"] or not splits["val"]:
        raise ConfigError(
            f"a run needs train and val episodes, got { ({k: len(v) for k, v in splits.items()}) }",
            path="dataset.params.episodes",
        )
    if check:
        base = env["url"] if url is not None else serve(env["server"], search)  # one of the two, checked above
        try:
            client = connect(base, transport, timeout=float(timeout))
            try:
                client.reset(seed=splits["train"][0], **env["reset"])
            finally:
                client.close()
        except InfraError as e:
            where = f"url: {url}" if url is not None else f"server: {server}"
            raise InfraError(
                f"the env world's server ({where}) did not answer a reset before the run: {e}. Start it "
                "(or fix dataset.params), then run again",
                category=e.category,
            ) from None
    return {name: [{"id": f"seed-{s}", "seed": s, "env": env} for s in splits[name]] for name in SPLITS}


__all__ = ["DEFAULT_EPISODES", "FORMATS", "SCORES", "SPLITS", "dataset"]

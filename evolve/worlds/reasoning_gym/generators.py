"""The generators a task file names, and reasoning-gym's datasets and scorers behind them.

``dataset.params.generators`` is a list; each entry a generator's name, or::

    {name: basic_arithmetic, config: {max_terms: 3}, levels: [{max_digits: 1}, {max_digits: 2}], weight: 2}

``config`` is the generator's settings (its config dataclass's fields, ``seed`` and ``size`` aside);
``levels`` are difficulty levels from easy to hard, each merged over ``config`` (none: ``config`` is
the one level); ``weight`` is the generator's share of every split (default 1). The package itself
is imported only here, when a dataset or a scorer is first needed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any

from evolve.errors import ConfigError, MissingDependency

WHERE = "dataset.params.generators"


@dataclass(frozen=True)
class Generator:
    """One entry of ``generators``: its name, its levels' configs (easy to hard) and its weight."""

    name: str
    levels: tuple[dict[str, Any], ...]
    weight: float = 1.0


def package() -> Any:
    """The ``reasoning_gym`` package; :class:`MissingDependency` with the install line when absent."""
    try:
        import reasoning_gym
    except ImportError:
        raise MissingDependency(
            "world: reasoning_gym needs the reasoning-gym package; install it with: "
            "pip install 'evolvekit[reasoning_gym]'"
        ) from None
    return reasoning_gym


def known() -> dict[str, Any]:
    """name -> (dataset class, config class) of every generator the installed package has."""
    package()
    from reasoning_gym.factory import DATASETS

    return DATASETS


def parse(entries: Any) -> list[Generator]:
    """``generators`` checked: names the package knows, configs its generators accept, positive
    weights, one entry per name. Every mistake is a :class:`ConfigError` naming where it is."""
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            "give a non-empty list of generators, e.g. [{name: basic_arithmetic, config: {max_terms: 3}}]", path=WHERE
        )
    datasets = known()
    out: list[Generator] = []
    for i, e in enumerate(entries):
        where = f"{WHERE}.{i}"
        e = {"name": e} if isinstance(e, str) else e
        if not isinstance(e, dict):
            raise ConfigError(
                f"a generator is a name or a mapping {{name, config, levels, weight}}, not {type(e).__name__}",
                path=where,
            )
        unknown = sorted(set(e) - {"name", "config", "levels", "weight"})
        if unknown:
            raise ConfigError(
                f"unknown key(s) {unknown}; a generator takes name, config, levels and weight", path=where
            )
        name = e.get("name")
        if name not in datasets:
            from evolve.registry import did_you_mean

            raise ConfigError(
                f"reasoning-gym has no generator {name!r}; {did_you_mean(str(name), list(datasets))}",
                path=f"{where}.name",
            )
        if any(g.name == name for g in out):
            raise ConfigError(
                f"{name} is named twice; give it once, with its configs as levels (easy to hard)", path=where
            )
        base = e.get("config") or {}
        levels = e.get("levels") or [{}]
        if not isinstance(base, dict) or not isinstance(levels, list) or not all(isinstance(c, dict) for c in levels):
            raise ConfigError("config is a mapping of settings and levels a list of them", path=where)
        weight = e.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ConfigError(f"weight must be a positive number, not {weight!r}", path=f"{where}.weight")
        configs = tuple({**base, **lv} for lv in levels)
        for j, cfg in enumerate(configs):
            check_config(name, cfg, f"{where}.levels.{j}" if e.get("levels") else f"{where}.config")
        out.append(Generator(name=name, levels=configs, weight=float(weight)))
    return out


def check_config(name: str, config: dict[str, Any], where: str) -> None:
    """Build the generator once with ``config``; a setting it lacks or refuses is a ConfigError."""
    fields = [f.name for f in dataclasses.fields(known()[name][1]) if f.name not in ("seed", "size")]
    bad = sorted(k for k in config if k in ("seed", "size"))
    if bad:
        raise ConfigError(f"{bad} are set by the world (disjoint seeds per split; n_train, n_val, n_test)", path=where)
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise ConfigError(f"{name} has no setting {unknown[0]!r}; its settings are {fields}", path=where)
    try:
        create(name, config, 0, 1)[0]
    except Exception as e:  # noqa: BLE001 - the package refuses the config (validate() asserts)
        raise ConfigError(f"{name} refuses this config ({type(e).__name__}: {e})", path=where) from None


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def create(name: str, config: dict[str, Any], seed: int, size: int) -> Any:
    """``reasoning_gym.create_dataset(name, seed=seed, size=size, **config)``, cached: item ``i``
    is generated from ``random.Random(seed + i)`` by almost every generator."""
    return _create(name, _key(config), int(seed), int(size))


@functools.lru_cache(maxsize=256)
def _create(name: str, config_key: str, seed: int, size: int) -> Any:
    return package().create_dataset(name, seed=seed, size=size, **json.loads(config_key))


@functools.lru_cache(maxsize=8192)
def _entry(name: str, config_key: str, seed: int, size: int, index: int) -> dict[str, Any]:
    return _create(name, config_key, seed, size)[index]


def entry_of(task: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The dataset and the package's own entry (question, answer, metadata as generated: never
    read back from JSON) that ``task`` was made from; ValueError when the task does not match it."""
    key = _key(task["config"])
    ds = _create(task["generator"], key, int(task["seed"]), int(task["size"]))
    entry = _entry(task["generator"], key, int(task["seed"]), int(task["size"]), int(task["index"]))
    if entry["question"] != task["question"]:
        raise ValueError(
            f"task {task.get('id')!r} is not what {task['generator']} generates from its seed and config "
            "(another reasoning-gym version made it?): rebuild the dataset"
        )
    return ds, entry


def score(task: dict[str, Any], answer: str) -> float:
    """The package's own scorer (``score_answer``) on ``answer`` for ``task``."""
    ds, entry = entry_of(task)
    return float(ds.score_answer(answer, entry))


__all__ = ["Generator", "WHERE", "check_config", "create", "entry_of", "known", "package", "parse", "score"]

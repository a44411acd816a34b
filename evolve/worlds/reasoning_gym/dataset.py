"""The splits: train, val and test tasks from disjoint seed ranges of each generator and level.

Item ``i`` of a split, at level ``l`` of a generator, is the package's item from seed
``base + i``, with ``base = 30,000,000·seed + 10,000,000·k + 100,000·l`` (``k`` 0 for train, 1 for
val, 2 for test): the three splits never share an item seed (nor two levels), whatever the sizes.
A few generators draw from a finite pool (or from one seed for the whole dataset), so the same
question can still come out twice: test is built first, then val, then train, and a question
already in an earlier split (or earlier in its own) is skipped for the next item. Val and test
therefore depend only on the seed, the generators and their own sizes, never on ``n_train``.

Sizes are totals per split, shared among the generators by weight (largest remainder) and within
a generator evenly over its levels, the easier levels taking what does not divide.
"""

from __future__ import annotations

from typing import Any

from evolve.errors import ConfigError
from evolve.worlds.reasoning_gym.answer import check_format
from evolve.worlds.reasoning_gym.generators import Generator, create, parse

SPLIT_STRIDE = 10_000_000
LEVEL_STRIDE = 100_000
ORDER = (("test", 2), ("val", 1), ("train", 0))  # built in this order (see the module docstring)


def item_base(seed: int, split_index: int, level: int) -> int:
    """The seed of item 0 of a split's level (item ``i``: this plus ``i``)."""
    return 3 * SPLIT_STRIDE * int(seed) + SPLIT_STRIDE * split_index + LEVEL_STRIDE * level


def shares(n: int, weights: list[float]) -> list[int]:
    """``n`` split by ``weights``: largest remainder, ties to the earlier entry."""
    total = sum(weights)
    raw = [n * w / total for w in weights]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))[: n - sum(out)]:
        out[i] += 1
    return out


def counts(n: int, gens: list[Generator]) -> list[list[int]]:
    """Tasks per generator and level for a split of ``n``."""
    return [shares(k, [1.0] * len(g.levels)) for k, g in zip(shares(n, [g.weight for g in gens]), gens)]


def _level_tasks(
    g: Generator, level: int, split: str, k: int, n: int, seed: int, fmt: str, seen: set[str]
) -> list[dict[str, Any]]:
    size = 4 * n + 100  # the items tried at most: generator and level own LEVEL_STRIDE seeds per split
    base = item_base(seed, k, level)
    ds = create(g.name, g.levels[level], base, size)
    out: list[dict[str, Any]] = []
    for index in range(size):
        if len(out) == n:
            break
        item = ds[index]
        if item["question"] in seen:
            continue
        seen.add(item["question"])
        out.append(
            {
                "id": f"rg-{split}-{g.name}-L{level}-{len(out):05d}",
                "split": split,
                "generator": g.name,
                "level": level,
                "config": dict(g.levels[level]),
                "seed": base,
                "size": size,
                "index": index,
                "question": item["question"],
                "answer": None if item["answer"] is None else str(item["answer"]),
                "answer_format": fmt,
            }
        )
    if len(out) < n:
        raise ConfigError(
            f"{g.name} at level {level} gave only {len(out)} distinct new questions in {size} tries "
            f"for {split} (asked for {n}); ask for fewer tasks, or widen that level's config",
            path="dataset.params",
        )
    return out


def dataset(
    seed: int = 0,
    generators: Any = None,
    n_train: int = 200,
    n_val: int = 50,
    n_test: int = 100,
    answer_format: str = "answer_line",
) -> dict[str, list[dict[str, Any]]]:
    """``{"train", "val", "test"}`` task lists (see the module docstring). A task is ``id, split,
    generator, level, config, seed, size, index`` (where the package makes it from), ``question``,
    ``answer`` (the gold, for demos; None for generators that check an answer by simulation; the
    reward regenerates the package's own entry to score) and ``answer_format``
    (:mod:`evolve.worlds.reasoning_gym.answer`)."""
    if generators is None:
        raise ConfigError(
            "name the generators, e.g. generators: [{name: basic_arithmetic, config: {max_terms: 3}}]",
            path="dataset.params.generators",
        )
    try:
        fmt = check_format(answer_format)
    except ValueError as e:
        raise ConfigError(str(e), path="dataset.params.answer_format") from None
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    for split, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(
                f"n_{split} must be a whole number of tasks (0 or more), not {n!r}", path="dataset.params"
            )
    gens = parse(generators)
    if max(len(g.levels) for g in gens) > SPLIT_STRIDE // LEVEL_STRIDE:
        raise ConfigError(f"a generator has more than {SPLIT_STRIDE // LEVEL_STRIDE} levels", path="dataset.params")
    seen: dict[str, set[str]] = {g.name: set() for g in gens}
    out: dict[str, list[dict[str, Any]]] = {}
    for split, k in ORDER:
        tasks: list[dict[str, Any]] = []
        for g, per_level in zip(gens, counts(sizes[split], gens)):
            for level, n in enumerate(per_level):
                if 4 * n + 100 > LEVEL_STRIDE:
                    raise ConfigError(
                        f"{n} {split} tasks of {g.name} at one level is more than this world's seed "
                        f"ranges hold ({(LEVEL_STRIDE - 100) // 4})",
                        path="dataset.params",
                    )
                tasks += _level_tasks(g, level, split, k, n, seed, fmt, seen[g.name]) if n else []
        out[split] = tasks
    return {s: out[s] for s in ("train", "val", "test")}


__all__ = ["LEVEL_STRIDE", "SPLIT_STRIDE", "counts", "dataset", "item_base", "shares"]

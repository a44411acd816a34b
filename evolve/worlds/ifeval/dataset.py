"""The splits: test from the prompt file the user points to, train and val generated.

* ``test``: the prompts of ``path`` (IFEval's ``input_data.jsonl`` shape: ``key``, ``prompt``,
  ``instruction_id_list``, ``kwargs``), all of them, or with ``n_test`` a random subset drawn with
  ``test_seed`` (0), the same for every run seed, so that rows on several seeds are paired on the
  same prompts. With ``test: unseen`` the test split is instead ``n_test`` generated prompts whose
  constraint parameters are the held-out ones (:mod:`~evolve.worlds.ifeval.generate`), to score a
  system on parameters it never trained on.
* ``train``, ``val``: ``n_train`` and ``n_val`` generated prompts from two disjoint random streams
  of the run seed; a prompt text already in an earlier split (or in the test file) is drawn again.
* ``unseen`` (when the test split is the file): ``n_unseen`` generated prompts, each with at least
  one held-out parameter, the same prompts for every run seed and the ones ``test: unseen``
  gives; drawn after the other splits so that adding it changes none of them: any run's systems
  can be scored on parameters they never trained on, ``evolve eval task.yaml RUN --split unseen``,
  without a new run.

IFEval's prompts are for evaluation only: they never reach train or val, nor any hook that builds
demos or memories (those read training tasks).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError
from evolve.worlds.ifeval.checks import check_args
from evolve.worlds.ifeval.generate import generated_prompt

TESTS = ("file", "unseen")


def read_prompts(path: Path) -> list[dict[str, Any]]:
    """The prompts of an IFEval-shaped JSONL file, checked; a bad line is an error naming it."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(
            f"cannot read the IFEval prompt file {path}: {e.strerror or e}; point dataset.params.path "
            "at IFEval's input_data.jsonl",
            path="dataset.params.path",
        ) from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ids, kwargs = list(row["instruction_id_list"]), [dict(k or {}) for k in row["kwargs"]]
            check_args(ids, kwargs)
            out.append(
                {"key": row.get("key", n), "prompt": str(row["prompt"]), "instruction_id_list": ids, "kwargs": kwargs}
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{path} line {n} is not an IFEval prompt ({type(e).__name__}: {e}); each line needs "
                "prompt, instruction_id_list and kwargs",
                path="dataset.params.path",
            ) from None
    if not out:
        raise ConfigError(f"{path} holds no prompts", path="dataset.params.path")
    return out


def _generated(rng: random.Random, n: int, split: str, seen: set[str], unseen: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(50 * n + 100):
        if len(out) == n:
            return out
        p = generated_prompt(rng, unseen=unseen)
        if p["prompt"] in seen:
            continue
        seen.add(p["prompt"])
        out.append({"id": f"ifeval-{split}-{len(out):05d}", "split": split, **p})
    raise ConfigError(
        f"only {len(out)} distinct {split} prompts could be generated (asked for {n})", path="dataset.params"
    )


def _size(name: str, n: Any, allow_none: bool = False) -> int | None:
    if n is None and allow_none:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(
            f"{name} must be a whole number of prompts (0 or more), not {n!r}", path=f"dataset.params.{name}"
        )
    return n


def dataset(
    seed: int = 0,
    path: str | None = None,
    n_train: int = 1000,
    n_val: int = 100,
    n_test: int | None = None,
    test: str = "file",
    test_seed: int = 0,
    n_unseen: int = 200,
    base_dir: Path | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """``{"train", "val", "test", "unseen"}`` (see the module docstring; no ``unseen`` when the test
    split is made of those prompts). A task is ``id, split, prompt, instruction_id_list, kwargs``
    (and ``key`` for a prompt of the file)."""
    sizes = {
        "n_train": _size("n_train", n_train),
        "n_val": _size("n_val", n_val),
        "n_test": _size("n_test", n_test, allow_none=True),
        "n_unseen": _size("n_unseen", n_unseen),
    }
    if test not in TESTS:
        raise ConfigError(f"test must be one of {list(TESTS)}, not {test!r}", path="dataset.params.test")
    seen: set[str] = set()
    if test == "file":
        if not path:
            raise ConfigError(
                "name the test prompts: path: <IFEval's input_data.jsonl> (relative to the task file)",
                path="dataset.params.path",
            )
        file = Path(path) if Path(path).is_absolute() or base_dir is None else Path(base_dir) / path
        prompts = read_prompts(file)
        if sizes["n_test"] is not None and sizes["n_test"] < len(prompts):
            prompts = random.Random(f"ifeval-test:{test_seed}").sample(prompts, sizes["n_test"])
            prompts.sort(key=lambda p: p["key"])
        tests = [{"id": f"ifeval-{p['key']}", "split": "test", **p} for p in prompts]
        seen.update(p["prompt"] for p in prompts)
    else:
        tests = _unseen(test_seed, sizes["n_test"] or 200, seen)
    val = _generated(random.Random(f"ifeval-val:{seed}"), sizes["n_val"] or 0, "val", seen, False)
    train = _generated(random.Random(f"ifeval-train:{seed}"), sizes["n_train"] or 0, "train", seen, False)
    out = {"train": train, "val": val, "test": tests}
    if test == "file" and (n := sizes["n_unseen"]):
        out["unseen"] = _unseen(test_seed, n, seen)
    return out


def _unseen(test_seed: int, n: int, seen: set[str]) -> list[dict[str, Any]]:
    """Generated prompts with the held-out constraint parameters, the same stream for every run seed."""
    return _generated(random.Random(f"ifeval-unseen:{test_seed}"), n, "unseen", seen, True)


__all__ = ["TESTS", "dataset", "read_prompts"]

"""Datasets: a generator callable or JSONL files, split into train / val / test."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError
from evolve.registry import import_path
from evolve.task.config import DatasetConfig

Splits = dict[str, list[dict[str, Any]]]


def _origin(given: bool) -> str:
    return "given there" if given else "assigned: the line has no 'id', so it gets FILE-LINE"


def read_jsonl(path: Path, field: str) -> list[dict[str, Any]]:
    if not path.exists():
        raise ConfigError(
            f"dataset file {str(path)!r} does not exist; fix the path (relative paths start at the task file's folder)",
            path=field,
        )
    tasks = []
    first_line: dict[str, tuple[int, bool]] = {}  # id -> (line, whether the line gave it)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read dataset file {str(path)!r}: {e}", path=field) from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"{path}:{i}: not valid JSON ({e.msg}); each line must be one JSON object", path=field
            ) from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{i}: each line must be a JSON object, got {type(row).__name__}", path=field)
        given = "id" in row
        row.setdefault("id", f"{path.stem}-{i}")
        tid = str(row["id"])
        if tid in first_line:
            j, given_there = first_line[tid]
            raise ConfigError(
                f"{path}:{i}: task id {tid!r} ({_origin(given)}) is already the id of line {j} "
                f"({_origin(given_there)}); give every task a unique 'id'",
                path=field,
            )
        first_line[tid] = (i, given)
        tasks.append(row)
    if not tasks:
        raise ConfigError(f"dataset file {str(path)!r} holds no tasks", path=field)
    return tasks


def load_splits(cfg: DatasetConfig, base: Path, seed: int, source: str = "task") -> Splits:
    if cfg.source is not None:
        fn = import_path(cfg.source, what="dataset.source", search=base)
        kwargs = dict(cfg.params)
        accepts = inspect.signature(fn).parameters
        if "seed" in accepts and "seed" not in kwargs:
            kwargs["seed"] = seed
        if "base_dir" in accepts and "base_dir" not in kwargs:  # the task file's folder, for relative paths
            kwargs["base_dir"] = base
        try:
            splits = fn(**kwargs)
        except TypeError as e:
            raise ConfigError(
                f"calling {cfg.source} with {kwargs} failed: {e}", path="dataset.params", source=source
            ) from None
        if not isinstance(splits, dict) or "train" not in splits or "val" not in splits:
            raise ConfigError(
                f"{cfg.source} must return a dict with 'train' and 'val' (and 'test') task lists",
                path="dataset.source",
                source=source,
            )
    else:
        splits = {}
        for name in ("train", "val", "test"):
            rel = getattr(cfg, name)
            if rel is None:
                continue
            p = Path(rel)
            splits[name] = read_jsonl(p if p.is_absolute() else base / p, f"dataset.{name}")
    splits.setdefault("test", [])
    for name, tasks in splits.items():
        ids = [str(t.get("id")) for t in tasks]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ConfigError(
                f"split {name!r} has the task id {dup!r} {ids.count(dup)} times; every task needs a unique 'id'",
                path="dataset",
                source=source,
            )
    return splits

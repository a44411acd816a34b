"""Build the SQL world's databases and tasks (cached on disk), and turn tasks into SFT demos.

Layout of a build root::

    root/manifest.json            seed, sizes, generator hash, and the build key
    root/<key>/tasks.json         {"train": [...], "val": [...], "test": [...]}
    root/<key>/db/<split>-NNNN.sqlite

Tasks on disk name their database relative to ``root``; :func:`build` returns them with
absolute paths. Train and val databases are named from train-side words, test databases
from test-side words only (see :mod:`evolve.worlds.sql.vocab`). With ``val_side="test"`` the
val databases come from held-out (test-side) domains too, their own databases and tasks, not
test's: selection on val then measures what test measures (``examples/sql_agent/demo_probe.py``
found demo choice correlating with test at about +0.3 that way, about 0 on train-side val).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from evolve.types import content_hash
from evolve.worlds.sql.questions import make_questions
from evolve.worlds.sql.schema import make_schema

LAYOUT_VERSION = "sql-world-1"
SPLITS = (("train", "train"), ("val", "train"), ("test", "test"))  # (split, name side)


def generator_hash() -> str:
    """Hash of the generator's source: any change to it invalidates cached builds."""
    h = hashlib.sha256(LAYOUT_VERSION.encode())
    for name in ("vocab.py", "schema.py", "questions.py"):
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:16]


def _params(seed: int, n_train: int, n_val: int, n_test: int, val_side: str = "train") -> dict[str, Any]:
    if val_side not in ("train", "test"):
        raise ValueError(
            f"val_side must be 'train' (val from training domains) or 'test' (from held-out domains), not {val_side!r}"
        )
    extra = {"val_side": val_side} if val_side != "train" else {}  # the default keeps earlier cache keys
    return {"seed": seed, "n_train": n_train, "n_val": n_val, "n_test": n_test, "generator": generator_hash(), **extra}


def generate_split(split: str, side: str, n: int, seed: int, db_dir: Path, key: str) -> list[dict]:
    tasks: list[dict] = []
    i = 0
    while len(tasks) < n:
        rng = random.Random(f"sql-world:{seed}:{split}:{i}")
        schema = make_schema(rng, side)
        conn = schema.connect()
        try:
            qs = make_questions(rng, schema, conn, min(rng.randint(3, 5), n - len(tasks)))
            if qs:
                rel = f"{key}/db/{split}-{i:04d}.sqlite"
                schema.save(db_dir / f"{split}-{i:04d}.sqlite", conn)
        finally:
            conn.close()
        for template, question, sql in qs:
            tasks.append(
                {
                    "id": f"sql-s{seed}-{split}-{len(tasks):05d}",
                    "split": split,
                    "domain": schema.domain,
                    "template": template,
                    "db": rel,
                    "schema": schema.render(),
                    "question": question,
                    "gold_sql": sql,
                }
            )
        i += 1
    return tasks


def with_db_paths(tasks: dict[str, list[dict]], root: Path) -> dict[str, list[dict]]:
    return {s: [dict(t, db=str(root / t["db"])) for t in ts] for s, ts in tasks.items()}


def build(
    root: str | Path,
    *,
    seed: int = 0,
    n_train: int = 2000,
    n_val: int = 200,
    n_test: int = 300,
    val_side: str = "train",
) -> dict[str, list[dict]]:
    """Generate the databases and tasks under ``root`` (deterministic in ``seed``) and return
    ``{"train": [...], "val": [...], "test": [...]}``. A root that already holds the same build
    (same seed, sizes and generator) is reused as is."""
    root = Path(root).expanduser().resolve()
    params = _params(seed, n_train, n_val, n_test, val_side)
    key = content_hash(params)
    manifest = root / "manifest.json"
    tasks_file = root / key / "tasks.json"
    try:
        if json.loads(manifest.read_text()).get("key") == key and tasks_file.is_file():
            return with_db_paths(json.loads(tasks_file.read_text()), root)
    except (OSError, ValueError):
        pass
    root.mkdir(parents=True, exist_ok=True)
    if not tasks_file.is_file():
        tmp = root / f".tmp-{uuid.uuid4().hex}"
        (tmp / "db").mkdir(parents=True)
        try:
            sizes = {"train": n_train, "val": n_val, "test": n_test}
            sides = dict(SPLITS, val=val_side)
            out = {
                split: generate_split(split, sides[split], sizes[split], seed, tmp / "db", key) for split, _ in SPLITS
            }
            (tmp / "tasks.json").write_text(json.dumps(out, indent=0))
            try:
                os.rename(tmp, root / key)
            except OSError:  # another process finished the same build first
                if not tasks_file.is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for old in root.iterdir():  # drop stale builds of this root (only ours: hex key dirs)
        if old.name != key and re.fullmatch(r"[0-9a-f]{16}", old.name) and (old / "tasks.json").is_file():
            shutil.rmtree(old, ignore_errors=True)
    tmp_manifest = root / f".manifest-{uuid.uuid4().hex}"
    tmp_manifest.write_text(json.dumps(dict(params, key=key), indent=1))
    os.replace(tmp_manifest, manifest)
    return with_db_paths(json.loads(tasks_file.read_text()), root)


def cache_root() -> Path:
    """``$EVOLVE_CACHE_DIR/sql_world`` when set, else ``~/.cache/evolvekit/sql_world``."""
    from evolve.artifacts import cache_dir

    return cache_dir("sql_world")


def dataset(
    seed: int = 0, root: str | Path | None = None, val_side: str = "train", **sizes: int
) -> dict[str, list[dict]]:
    """:func:`build` into ``root``, by default a cache folder named by the seed, sizes, val side
    and generator hash (so repeated calls are instant). ``sizes``: ``n_train``, ``n_val``, ``n_test``."""
    if root is None:
        full = {"n_train": 2000, "n_val": 200, "n_test": 300, **sizes}
        root = cache_root() / content_hash(_params(seed, val_side=val_side, **full))
    return build(root, seed=seed, val_side=val_side, **sizes)

"""A client's task file read field by field before anything in it is imported: :func:`check_task`.

Every import path (a name the task's registries do not hold) goes to :class:`~evolve.mcp.guard.RootsGuard`,
and every path it names (a file, a folder, a tracker's ``sqlite:///`` or ``file:`` URI) must lie in
the server's ``--root`` folders once symlinks are followed (:meth:`~evolve.mcp.roots.Roots.resolve`).
The keys and hosts it names must be those the server was started with (:mod:`evolve.mcp.grants`).
Each refusal is a :class:`~evolve.errors.ConfigError` naming the field. The fields are those of
:mod:`evolve.task.config` and the params of registered operators, datasets and trackers; an import
path anywhere else is still checked where it is imported (:func:`evolve.registry.import_path`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from evolve.errors import ConfigError, UserError
from evolve.mcp.guard import RootsGuard, canonical
from evolve.mcp.roots import Roots

SPLITS = ("train", "val", "test")
# dataset params that name files or folders (the sql world's root, harbor's source, the gateway's store)
DATA_PATHS = ("root", "source", "store", "base_dir", "db", "path", "dir", "folder", "file", "cache_dir")
DATA_CODE = ("server",)  # the env world's ASGI app
URIS = ("tracking_uri", "registry_uri")  # mlflow's
TRACKER_PATHS = ("dir",)  # wandb's
ENGINE = (
    ("selector", "selectors"),
    ("acceptance", "acceptances"),
    ("minibatch_sampler", "minibatch_samplers"),
    ("stopping", "stoppings"),
)
RUNNER_REFUSED = {
    "runtime_env": "installs packages and sets environment variables in the run's workers",
    "address": "connects the run to a Ray cluster elsewhere, which is handed the task's code",
}


def check_task(task: str | Path, sets: Sequence[str], guard: RootsGuard) -> None:
    """Refuse ``task`` (with its ``--set`` overrides) if it names code or paths a client may not."""
    from evolve.task.taskfile import apply_override, parse_override, read_task_file

    p = Path(task)
    data = read_task_file(p)
    for item in sets:
        keys, value = parse_override(item)
        apply_override(data, keys, value, item)
    _Fields(data, p, guard).check()
    from evolve.mcp.grants import Grants, check

    check(data, Grants.from_env(), str(p))


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _strings(value: Any) -> Iterable[tuple[str, str]]:
    """``(suffix, text)`` of each string in a str, a list or a mapping's values."""
    if isinstance(value, str):
        yield "", value
    elif isinstance(value, list):
        yield from ((f".{i}", v) for i, v in enumerate(value) if isinstance(v, str))
    elif isinstance(value, dict):
        yield from ((f".{k}", v) for k, v in value.items() if isinstance(v, str))


class _Fields:
    def __init__(self, data: dict, task: Path, guard: RootsGuard) -> None:
        self.data, self.source, self.guard = data, str(task), guard
        self.base = task.parent.resolve()
        self.roots = Roots(guard.roots)

    def fail(self, field: str, message: str) -> None:
        raise ConfigError(message, path=field, source=self.source)

    # ------------------------------------------------------------------ kinds of field

    def code(self, field: str, value: Any, evolve: Iterable[str] | None = None) -> None:
        evolve = self.guard.parts() if evolve is None else evolve
        for suffix, text in _strings(value):
            self.guard.check(text, what=field + suffix, search=self.base, evolve=evolve, source=self.source)

    def named(self, field: str, value: Any, kind: str) -> None:
        """A registry's name (or what one stands for), else an import path of the task's own."""
        from evolve import registry

        reg = getattr(registry, kind)
        if not isinstance(value, str) or value in reg or canonical(value) in map(canonical, reg.entries().values()):
            return
        if ":" in value:
            self.code(field, value, evolve=())

    def path(self, field: str, value: Any, *, bases: Sequence[Path] = ()) -> None:
        """A file or folder (relative to the task file's folder, or each of ``bases``) in the roots."""
        for suffix, text in _strings(value):
            for base in bases or (self.base,):
                try:
                    self.roots.resolve(text, want="new", what=field + suffix, base=base)
                except UserError as e:
                    raise ConfigError(str(e), source=self.source) from None

    def uri(self, field: str, value: Any) -> None:
        """A tracking URI: http(s), or a database or folder (``sqlite:///``, ``file:``, a path) in the roots."""
        if not isinstance(value, str):
            return
        parts = urlsplit(value)
        scheme = parts.scheme.lower()
        if scheme in ("http", "https"):
            return
        if scheme == "sqlite":
            where = value.split("?", 1)[0][len("sqlite://") :]
            if not where.strip("/"):
                return  # sqlite:// is in memory
            self.path(field, unquote(where[1:]), bases=(Path.cwd(),))
        elif scheme == "file":
            if parts.netloc not in ("", "localhost"):
                self.fail(
                    field,
                    f"{value!r} names another machine; give a file: URI or a path in the server's "
                    f"--root folders ({self.roots.describe()})",
                )
            self.path(field, unquote(parts.path), bases=(Path.cwd(),))
        elif scheme == "" or len(scheme) == 1:  # a plain path (or a Windows drive)
            self.path(field, value, bases=(Path.cwd(),))
        else:
            self.fail(
                field,
                f"{value!r}: through evolve mcp a tracking URI is http(s)://HOST, or a sqlite:///, "
                f"file: URI or a folder in the server's --root folders ({self.roots.describe()})",
            )

    def model(self, field: str, spec: Any) -> None:
        spec = _dict(spec)
        params = _dict(spec.get("params"))
        self.code(f"{field}.params.reply", params.get("reply"))
        weights = params.get("weights")
        if isinstance(weights, str) and (
            Path(weights).is_absolute() or weights.startswith((".", "~")) or (self.base / weights).exists()
        ):
            self.path(f"{field}.params.weights", weights)  # else a Hugging Face Hub id
        cold = _dict(spec.get("cold_start"))
        for key in ("demos", "pointer_words"):
            self.code(f"{field}.cold_start.{key}", cold.get(key))

    # ------------------------------------------------------------------ the task file

    def check(self) -> None:
        d = self.data
        self.named("world", d.get("world"), "worlds")
        for key in ("agent", "reward"):
            self.code(key, d.get(key))
        self.dataset(_dict(d.get("dataset")))
        for role, spec in _dict(d.get("models")).items():
            self.named(f"models.{role}.backend", _dict(spec).get("backend"), "llm_backends")
            self.model(f"models.{role}", spec)
        for i, op in enumerate(_list(d.get("operators"))):
            self.operator(f"operators.{i}", _dict(op))
        runner = _dict(d.get("runner"))
        self.named("runner.name", runner.get("name"), "runners")
        for key, why in RUNNER_REFUSED.items():
            if _dict(runner.get("params")).get(key) is not None:
                self.fail(
                    f"runner.params.{key}",
                    f"{why}; evolve mcp does not take it from a client's task (run `evolve run` yourself for that)",
                )
        engine = _dict(d.get("engine"))
        for key, kind in ENGINE:
            self.named(f"engine.{key}", engine.get(key), kind)
        for i, t in enumerate(_list(d.get("track"))):
            self.named(f"track.{i}.name", _dict(t).get("name"), "trackers")
            params = _dict(_dict(t).get("params"))
            for key in URIS:
                self.uri(f"track.{i}.params.{key}", params.get(key))
            for key in TRACKER_PATHS:
                self.path(f"track.{i}.params.{key}", params.get(key), bases=(Path.cwd(),))
        self.path("tools", d.get("tools"))
        self.path("memory.store", _dict(d.get("memory")).get("store"))
        self.path("out", d.get("out"), bases=(Path.cwd(),))
        deploy = _dict(d.get("deploy"))
        suites = [("deploy.regression", _dict(deploy.get("regression")))]
        suites += [(f"deploy.guards.{i}", _dict(g)) for i, g in enumerate(_list(deploy.get("guards")))]
        for field, suite in suites:
            self.code(f"{field}.reward", suite.get("reward"))
            if suite.get("tasks") not in (None, *SPLITS):
                self.path(f"{field}.tasks", suite.get("tasks"))

    def dataset(self, ds: dict) -> None:
        from evolve.task.taskfile import is_data_location

        source = ds.get("source")
        if is_data_location(source, self.source):
            self.path("dataset.source", source)
        else:
            self.code("dataset.source", source, evolve=self.guard.datasets())
        for split in SPLITS:
            self.path(f"dataset.{split}", ds.get(split))
        params = _dict(ds.get("params"))
        for key in DATA_PATHS:  # relative to the task file's folder or to the run's: each must stay in
            self.path(f"dataset.params.{key}", params.get(key), bases=(self.base, Path.cwd()))
        for key in DATA_CODE:
            self.code(f"dataset.params.{key}", params.get(key))

    def operator(self, field: str, op: dict) -> None:
        """Its name, and the params its ``Params`` model describes as import paths or folders/files."""
        from evolve.registry import operators

        name, params = op.get("name"), _dict(op.get("params"))
        self.named(f"{field}.name", name, "operators")
        for key, value in params.items():
            if isinstance(value, dict) and "backend" in value:  # a model spec (a mutating or reflecting LLM)
                self.model(f"{field}.params.{key}", value)
        if not isinstance(name, str) or name not in operators:
            return  # the task's own operator: its params are its own (imports are still checked)
        model = getattr(operators.get(name), "Params", None)
        for key, info in getattr(model, "model_fields", {}).items():
            about = (info.description or "").lower()
            if key not in params:
                continue
            if "import path" in about:
                self.code(f"{field}.params.{key}", params[key])
            elif "folder" in about or " file" in about:
                self.path(f"{field}.params.{key}", params[key], bases=(self.base, Path.cwd()))


__all__ = ["check_task"]

"""Reading a task file: YAML, validated once by the config models (:mod:`evolve.task.config`).

Precedence: model defaults < the world's (``world: sql``) < YAML < ``--set key=value`` overrides.
Every user mistake becomes a :class:`~evolve.errors.ConfigError` naming the file, the YAML path and
the fix, e.g. ``task.yaml: operators.0.params.temprature: unknown field; did you mean 'temperature'?``
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from evolve.errors import ConfigError, UserError
from evolve.registry import did_you_mean
from evolve.task.config import TaskConfig


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: write it as key.path=value, e.g. --set budget.generations=2")
    key, _, raw = item.partition("=")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return [p for p in key.strip().split(".") if p], value


def apply_override(data: dict, path: list[str], value: Any, item: str) -> None:
    node: Any = data
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {item!r}: {'.'.join(path[: i + 1])} is not an index of a list of {len(node)}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        else:
            raise ConfigError(f"--set {item!r}: {'.'.join(path[:i])} is a value, not a mapping")


def _model_at(loc: tuple, root: type[BaseModel] | None = None) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at ``loc`` (for did-you-mean)."""
    model: Any = root or TaskConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        ann = fields[part].annotation
        model = inner_model(ann)
        if model is None:
            return None
    return model if hasattr(model, "model_fields") else None


def inner_model(ann: Any) -> Any:
    """The pydantic model class inside an annotation (``X``, ``X | None``, ``dict[str, X]``), or None."""
    import typing

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        found = inner_model(arg)
        if found is not None:
            return found
    return None


def format_validation_error(
    e: ValidationError, source: str, root: type[BaseModel] | None = None, prefix: str = ""
) -> str:
    lines = []
    for err in e.errors():
        loc = tuple(err["loc"])
        path = prefix + ".".join(str(p) for p in loc if p not in ("function-after",))
        typ = err["type"]
        if typ == "extra_forbidden":
            owner = _model_at(loc, root)
            hint = did_you_mean(str(loc[-1]), list(owner.model_fields)) if owner else ""
            lines.append(f"{source}: {path}: unknown field; {hint}")
        elif typ == "missing":
            lines.append(f"{source}: {path}: required field is missing; add it")
        elif typ == "value_error":
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {path or '(top level)'}: {msg}")
        else:
            lines.append(f"{source}: {path}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def read_task_file(path: str | Path) -> dict:
    """The task file's YAML as a dict (not validated); a clear ConfigError when it is missing,
    not YAML, or not a mapping."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"task file {str(p)!r} does not exist; create one with: evolve init {p}")
    if p.is_dir():
        raise ConfigError(f"{str(p)!r} is a folder; give the task YAML file (e.g. {p / 'task.yaml'})")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the task file: {getattr(e, 'strerror', None) or e}", source=str(p)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"not valid YAML{where}: {getattr(e, 'problem', e)}", source=str(p)) from None
    if not isinstance(data, dict):
        raise ConfigError("the task file must be a YAML mapping (key: value lines)", source=str(p))
    return data


def load_task(path: str | Path, overrides: Sequence[str] = ()) -> tuple[TaskConfig, Path]:
    """Read, override and validate a task file. Returns the config and the file's folder."""
    p = Path(path)
    return validate_task(read_task_file(p), overrides, source=str(p)), p.parent.resolve()


def validate_task(data: dict, overrides: Sequence[str] = (), source: str = "task") -> TaskConfig:
    data = copy.deepcopy(data)
    for item in overrides:
        keys, value = parse_override(item)
        apply_override(data, keys, value, item)
    if data.get("world"):
        _apply_world(data, source)
    try:
        task = TaskConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None
    _check_operators(task, source)
    _check_workflow(task, source)
    for i, t in enumerate(task.track):
        check_tracker(t.name, t.params, path=f"track.{i}", source=source)
    return task


def check_tracker(name: str, params: dict, *, path: str = "track", source: str = "task") -> Any:
    """The tracker class ``name`` names (:data:`evolve.registry.trackers`), once its packages are
    found installed and ``params`` fit its ``Params`` model; else a ConfigError naming ``path``."""
    import importlib.util

    from evolve.errors import MissingDependency
    from evolve.registry import trackers

    try:
        cls = trackers.get(name)
    except UserError as e:
        raise ConfigError(str(e), path=f"{path}.name", source=source) from None
    for module, extra in getattr(cls, "requires", ()):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            raise MissingDependency(
                f"{source}: {path}: the {name} tracker needs the Python package {module!r}, which "
                f"is not installed; install it with: pip install 'evolvekit[{extra}]'"
            )
    params_model = getattr(cls, "Params", None)
    if params_model is not None:
        try:
            params_model.model_validate(params)
        except ValidationError as e:
            raise ConfigError(format_validation_error(e, source, params_model, prefix=f"{path}.params.")) from None
    return cls


def _apply_world(data: dict, source: str) -> None:
    """Fill what the task file leaves out from its ``world`` (see :mod:`evolve.world`): agent,
    reward, dataset.source, each local model's cold_start.demos, and the operator params a world
    hook provides (an operator class names them in ``world_params``: param -> hook)."""
    from evolve.registry import operators
    from evolve.world import load_world

    try:
        world = load_world(str(data["world"]))
    except ConfigError as e:
        raise ConfigError(str(e).removeprefix("world: "), path="world", source=source) from None
    data.setdefault("agent", world.agent)
    if isinstance(data["agent"], str) and data["agent"] in world.agents:  # ``agent: oracle``: the world's own
        data["agent"] = world.agents[data["agent"]]
    data.setdefault("reward", world.reward)
    ds = data.get("dataset")
    if isinstance(ds, dict) and is_data_location(ds.get("source"), source) and _takes_source(world.dataset):
        # ``dataset.source: tasks/`` (a folder or a list of them, not an import path): the world's own
        # dataset reads it, as its ``source`` parameter (resolved against the task file's folder)
        given = ds.get("params")
        params = given if isinstance(given, dict) else {}
        if "source" in params:
            raise ConfigError(
                "dataset.source names a folder and dataset.params.source is set too; keep one",
                path="dataset.source",
                source=source,
            )
        ds = data["dataset"] = {**ds, "params": {**params, "source": ds["source"]}}
        ds.pop("source")
    if ds is None or (isinstance(ds, dict) and not any(ds.get(k) for k in ("source", "train", "val", "test"))):
        data["dataset"] = {**(ds or {}), "source": world.dataset}
    demos = world.hook("coldstart.demos")
    for m in (data.get("models") or {}).values():
        cs = m.get("cold_start") if isinstance(m, dict) else None
        if isinstance(cs, dict) and "demos" not in cs and demos:
            cs["demos"] = demos
    for op in data.get("operators") or []:
        if not isinstance(op, dict) or op.get("name", "") not in operators:
            continue
        params = op.setdefault("params", {})
        for param, hook in getattr(operators.get(op["name"]), "world_params", {}).items():
            if isinstance(params, dict) and param not in params and world.hook(hook):
                params[param] = world.hook(hook)


def is_data_location(value: Any, source: str) -> bool:
    """A list, or a string that is a path ("tasks", "tasks/", "./x", "~/t", "/abs", a folder beside
    the task file) rather than an import path ("pkg.mod:fn", "pkg.mod.fn")."""
    if isinstance(value, list):
        return True
    if not isinstance(value, str) or ":" in value:
        return False
    beside = Path(source).parent / value if Path(source).is_file() else Path(value)
    return "/" in value or value.startswith((".", "~")) or "." not in value or beside.exists()


def _takes_source(dataset_path: str) -> bool:
    import inspect

    from evolve.registry import import_path

    try:
        return "source" in inspect.signature(import_path(dataset_path, what="world dataset")).parameters
    except (UserError, TypeError, ValueError):
        return False


def _check_operators(task: TaskConfig, source: str) -> None:
    """Unknown operator/selector/runner names and operator params are user errors, found at load."""
    from evolve.registry import operators, runners, selectors

    for i, op in enumerate(task.operators):
        try:
            cls = operators.get(op.name)
        except UserError as e:
            raise ConfigError(str(e), path=f"operators.{i}.name", source=source) from None
        params_model = getattr(cls, "Params", None)
        if params_model is not None:
            try:
                params_model.model_validate(op.params)
            except ValidationError as e:
                msg = format_validation_error(e, source, params_model, prefix=f"operators.{i}.params.")
                hooks = getattr(cls, "world_params", {})
                missing = [p for p in hooks if p not in op.params]
                if missing and not task.world:
                    msg += (
                        f", or name a world that provides it (`world: sql` fills {', '.join(missing)} from its "
                        f"{', '.join(hooks[p] for p in missing)} hook)"
                    )
                raise ConfigError(msg) from None
        check_models = getattr(cls, "check_models", None)  # e.g. a weight operator's roles against models
        if check_models is not None:
            try:
                check_models(op.params, task.models)
            except UserError as e:
                raise ConfigError(str(e), path=f"operators.{i}.params", source=source) from None
    from evolve.registry import acceptances, minibatch_samplers, stoppings

    eng = task.engine
    for field, reg, name in (
        ("engine.selector", selectors, eng.selector),
        ("runner.name", runners, task.runner.name),
        ("engine.acceptance", acceptances, eng.acceptance),
        ("engine.minibatch_sampler", minibatch_samplers, eng.minibatch_sampler),
        ("engine.stopping", stoppings, eng.stopping),
    ):
        if name not in reg and ":" not in name:
            raise ConfigError(
                f"unknown {reg.kind} {name!r}; {did_you_mean(name, reg.names())}", path=field, source=source
            )
    for field, reg, name, params in (
        ("engine.acceptance", acceptances, eng.acceptance, eng.acceptance_params),
        ("engine.minibatch_sampler", minibatch_samplers, eng.minibatch_sampler, {}),
        ("engine.stopping", stoppings, eng.stopping, eng.stopping_params),
    ):
        try:
            reg.get(name)(**params)  # built once per run with these: check they build
        except UserError as e2:
            raise ConfigError(str(e2), path=field, source=source) from None
        except (TypeError, ValueError) as e2:
            where = f"{field}_params" if params else field
            raise ConfigError(f"{name}: {e2}", path=where, source=source) from None
    _check_selector_params(task, source)
    from evolve.llm.params import check_keys
    from evolve.registry import llm_backends

    for role, m in task.models.items():
        if m.backend not in llm_backends:
            raise ConfigError(
                f"unknown {llm_backends.kind} {m.backend!r}; {did_you_mean(m.backend, llm_backends.names())}",
                path=f"models.{role}.backend",
                source=source,
            )
        check_keys(role, m.backend, m.params, source)


def _check_workflow(task: TaskConfig, source: str) -> None:
    """The task's workflow settings, checked by the layers that read them
    (:data:`evolve.registry.workflow_checks`; e.g. ``workflow.graph`` must be a valid graph of known
    node types, else every rollout would fail and the run would score 0)."""
    from evolve.registry import workflow_checks

    for name in workflow_checks.names():
        try:
            workflow_checks.get(name)(dict(task.workflow))
        except UserError as e:
            raise ConfigError(str(e), path=f"workflow.{name}", source=source) from None


def _check_selector_params(task: TaskConfig, source: str) -> None:
    """``engine.selector_params`` must fit the selector: its ``Params`` model, else its constructor."""
    import inspect

    from evolve.registry import selectors

    name, params = task.engine.selector, task.engine.selector_params
    cls = selectors.get(name)
    params_model = getattr(cls, "Params", None)
    if params_model is not None:
        try:
            params_model.model_validate(params)
        except ValidationError as e:
            raise ConfigError(
                format_validation_error(e, source, params_model, prefix="engine.selector_params.")
            ) from None
        return
    try:
        inspect.signature(cls).bind(**params)
    except TypeError:
        accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
        takes = f"takes {accepted}" if accepted else "takes no parameters"
        raise ConfigError(
            f"selector {name!r} {takes}; got {sorted(params)}", path="engine.selector_params", source=source
        ) from None


def run_dir_for(task: TaskConfig, base: Path) -> Path:
    if task.out:
        out = Path(task.out)
        return out if out.is_absolute() else Path.cwd() / out
    return Path.cwd() / "runs" / f"{task.name}-seed{task.seed}"

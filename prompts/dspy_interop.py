"""DSPy programs as evolvekit agents; their instructions and demos as the system's prompt components.

A DSPy program becomes an agent in a module beside the task file::

    # program.py
    import dspy
    from evolve.prompts.dspy_interop import dspy_agent

    def make_program():
        return dspy.ChainOfThought("question -> answer")

    agent = dspy_agent(make_program, inputs=["question"], output="answer")

    # task.yaml
    agent: program:agent

(or, for a program in an importable package, ``agent: evolve.prompts.dspy_interop:agent`` with
``workflow: {dspy: {program: "pkg.mod:make_program", inputs: [question], output: answer}}``).

Each rollout runs a deep copy of the program with the system's prompt components applied, under
``dspy.context(lm=..., adapter=...)`` (thread-local, so concurrent rollouts stay apart), with a
``dspy.LM`` that reaches the rollout's loopback OpenAI URL (:meth:`RolloutContext.openai_base_url
<evolve.rollout.RolloutContext.openai_base_url>`) through litellm, caching off: every LM call of
the program is an :class:`~evolve.types.LLMCall` step of the trajectory, with token ids.

Components (``System.prompts``), two per predictor (``program.named_predictors()``):

* ``"<predictor>.instruction"``: the signature's instructions;
* ``"<predictor>.demos"``: the few-shot demos as JSON text, a list of objects holding the
  signature's fields (e.g. ``[{"question": "...", "answer": "..."}]``).

:func:`components_from_program` reads them, :func:`apply_components` sets them on a deep copy,
:func:`write_back` gives (and saves) the program carrying an evolved system's components. When
the task file gives no prompts, the agent's ``initial_prompts`` supplies the program's own.
Settings in ``workflow.dspy`` (``inputs``, ``output``, ``role``, ``adapter``) override those
given to :func:`dspy_agent`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError, MissingDependency

INSTRUCTION, DEMOS = ".instruction", ".demos"
SETTINGS = ("program", "inputs", "output", "role", "adapter")


def import_dspy() -> Any:
    """Import dspy with litellm set up offline and quiet first (see :mod:`evolve.llm.litellm`)."""
    from evolve.llm.litellm import import_litellm

    try:
        import_litellm()
        import dspy
    except (ImportError, MissingDependency):
        raise MissingDependency(
            "DSPy interop needs the Python package 'dspy'; install it with: pip install 'evolvekit[prompts]'"
        ) from None
    return dspy


# ----------------------------------------------------------------------------- components


def _predictors(program: Any) -> dict[str, Any]:
    return dict(program.named_predictors())


def _demo_fields(demo: Any, signature: Any) -> dict[str, Any]:
    data = demo.toDict() if hasattr(demo, "toDict") else dict(demo)
    return {k: data[k] for k in signature.fields if k in data}


def components_from_program(program: Any) -> dict[str, str]:
    """``{"<predictor>.instruction": text, "<predictor>.demos": JSON list}`` for every predictor."""
    out: dict[str, str] = {}
    for name, pred in _predictors(program).items():
        out[name + INSTRUCTION] = pred.signature.instructions
        demos = [_demo_fields(d, pred.signature) for d in pred.demos]
        out[name + DEMOS] = json.dumps(demos, ensure_ascii=False, default=str)
    return out


def demos_from_json(text: str, signature: Any, where: str = "demos") -> list[Any]:
    """Parse a ``.demos`` component into ``dspy.Example``\\ s (inputs marked) for ``signature``."""
    dspy = import_dspy()
    try:
        rows = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as e:
        raise ValueError(
            f"prompt component {where!r} is not valid JSON ({e.msg}); it must be a JSON list of "
            f"objects with the fields {list(signature.fields)}"
        ) from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(
            f"prompt component {where!r} must be a JSON list of objects with the fields {list(signature.fields)}"
        )
    inputs = list(signature.input_fields)
    return [dspy.Example(**r).with_inputs(*[k for k in inputs if k in r]) for r in rows]


def apply_components(program: Any, prompts: Mapping[str, str]) -> Any:
    """A deep copy of ``program`` with the ``.instruction`` / ``.demos`` components in ``prompts``
    set on its predictors. Other components are ignored; one that names a predictor the program
    lacks raises ``KeyError`` (a typo must not be evolved silently)."""
    from evolve.registry import did_you_mean

    prog = program.deepcopy()
    preds = _predictors(prog)
    for key, text in prompts.items():
        for suffix in (INSTRUCTION, DEMOS):
            if not key.endswith(suffix):
                continue
            name = key[: -len(suffix)]
            pred = preds.get(name)
            if pred is None:
                raise KeyError(
                    f"prompt component {key!r} names no predictor of the program; its predictors are "
                    f"{sorted(preds)} ({did_you_mean(name, sorted(preds))})"
                )
            if suffix == INSTRUCTION:
                pred.signature = pred.signature.with_instructions(text)
            else:
                pred.demos = demos_from_json(text, pred.signature, where=key)
    return prog


def write_back(program: Any, system_or_prompts: Any, path: str | Path | None = None) -> Any:
    """The program carrying an evolved system's components (a ``System`` or a prompts mapping);
    saved with ``program.save(path)`` (DSPy's JSON state) when ``path`` is given."""
    prompts = getattr(system_or_prompts, "prompts", system_or_prompts)
    prog = apply_components(program, prompts)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        prog.save(str(path))
    return prog


# ----------------------------------------------------------------------------- running


def make_adapter(adapter: Any = "chat") -> Any:
    """``"chat"`` (DSPy's ChatAdapter, no JSON fallback: evolve serve refuses ``response_format``),
    ``"xml"``, or an adapter object used as it is."""
    if not isinstance(adapter, str):
        return adapter
    dspy = import_dspy()
    if adapter == "chat":
        return dspy.ChatAdapter(use_json_adapter_fallback=False)
    if adapter == "xml":
        return dspy.XMLAdapter()
    raise ConfigError(
        f"workflow.dspy.adapter: unknown adapter {adapter!r}; use 'chat' or 'xml' (JSON mode needs "
        "response_format, which the rollout gateway does not serve)"
    )


def openai_lm(api_base: str, api_key: str = "unused", *, model: str = "openai/policy", **kwargs: Any) -> Any:
    """A ``dspy.LM`` for an OpenAI-compatible endpoint, through litellm, no cache, no retries."""
    dspy = import_dspy()
    return dspy.LM(model, api_base=api_base, api_key=api_key, cache=False, num_retries=0, engine="litellm", **kwargs)


def rollout_lm(ctx: Any, role: str = "policy") -> Any:
    """A ``dspy.LM`` whose calls are ``ctx.llm(role)`` calls, recorded in the rollout's trajectory.
    It sends no temperature or max_tokens of its own, so the role's defaults (and an exploration
    rollout's temperature) apply as for a native call."""
    env = ctx.openai_env(role)
    return openai_lm(env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"], model=f"openai/{role}")


def program_inputs(task: Mapping[str, Any], inputs: Sequence[str] | Mapping[str, str]) -> dict[str, Any]:
    """The program's keyword arguments: ``inputs`` names task keys (a list), or maps argument -> task key."""
    pairs = inputs.items() if isinstance(inputs, Mapping) else ((k, k) for k in inputs)
    out = {}
    for arg, key in pairs:
        if key not in task:
            raise KeyError(
                f"the task has no key {key!r} (the DSPy program's input {arg!r}); its keys are {sorted(task)}"
            )
        out[arg] = task[key]
    return out


def prediction_output(pred: Any, output: str | None) -> Any:
    """``pred[output]``, or every field of the prediction as a dict when ``output`` is None."""
    if output is None:
        return pred.toDict() if hasattr(pred, "toDict") else dict(pred)
    return pred[output]


class DSPyAgent:
    """An evolvekit agent ``agent(task, ctx)`` that runs a DSPy program (see the module docstring).

    ``program``: a ``dspy.Module``, or a callable returning one (called once, on first use).
    ``inputs``: task keys passed as the program's keyword arguments (or ``{argument: task key}``).
    ``output``: the prediction field returned as the rollout's output (``None``: all fields).
    ``role``: the system's model role the program's LM calls go to. ``adapter``: see :func:`make_adapter`.
    """

    def __init__(
        self,
        program: Any,
        *,
        inputs: Sequence[str] | Mapping[str, str],
        output: str | None = None,
        role: str = "policy",
        adapter: Any = "chat",
    ) -> None:
        self._source = program
        self._program: Any = None
        self._lock = threading.Lock()
        self.settings = {"inputs": inputs, "output": output, "role": role, "adapter": adapter}

    @property
    def program(self) -> Any:
        """The starting program (built once; never run directly: each rollout runs a copy)."""
        if self._program is None:
            with self._lock:
                if self._program is None:
                    dspy = import_dspy()
                    prog = self._source if isinstance(self._source, dspy.Module) else self._source()
                    if not isinstance(prog, dspy.Module):
                        raise TypeError(f"the DSPy program factory returned {type(prog).__name__}, not a dspy.Module")
                    self._program = prog
        return self._program

    def initial_prompts(
        self, workflow: Mapping[str, Any] | None = None, base_dir: str | Path | None = None
    ) -> dict[str, str]:
        """The starting system's prompt components: the program's own."""
        return components_from_program(self.program)

    def resolved(self, workflow: Mapping[str, Any] | None) -> dict[str, Any]:
        over = dict((workflow or {}).get("dspy") or {})
        unknown = sorted(set(over) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"workflow.dspy: unknown setting(s) {unknown}; known: {list(SETTINGS)}")
        return {**self.settings, **{k: v for k, v in over.items() if k != "program"}}

    def __call__(self, task: dict, ctx: Any) -> Any:
        dspy = import_dspy()
        s = self.resolved(ctx.system.workflow)
        prog = apply_components(self.program, ctx.system.prompts)
        kwargs = program_inputs(task, s["inputs"])
        with dspy.context(lm=rollout_lm(ctx, s["role"]), adapter=make_adapter(s["adapter"])):
            pred = prog(**kwargs)
        return prediction_output(pred, s["output"])


def dspy_agent(
    program: Any,
    *,
    inputs: Sequence[str] | Mapping[str, str],
    output: str | None = None,
    role: str = "policy",
    adapter: Any = "chat",
) -> DSPyAgent:
    """Wrap a DSPy program (or a factory of one) as an evolvekit agent; see :class:`DSPyAgent`."""
    return DSPyAgent(program, inputs=inputs, output=output, role=role, adapter=adapter)


# ----------------------------------------------------------------------------- generic agent

_AGENTS: dict[str, DSPyAgent] = {}
_AGENTS_LOCK = threading.Lock()


def agent_for(workflow: Mapping[str, Any], base_dir: str | Path | None = None) -> DSPyAgent:
    """The :class:`DSPyAgent` named by ``workflow.dspy.program`` (``"pkg.mod:factory"``), built once
    per import path. ``base_dir`` (the task file's folder) is searched for the module first."""
    from evolve.registry import import_path

    spec = dict(workflow.get("dspy") or {})
    path = spec.get("program")
    if not path or "inputs" not in spec:
        raise ConfigError(
            "the agent evolve.prompts.dspy_interop:agent needs workflow.dspy.program (an import path "
            "'pkg.mod:make_program') and workflow.dspy.inputs (task keys passed to the program)"
        )
    with _AGENTS_LOCK:
        hit = _AGENTS.get(path)
        if hit is None:
            factory = import_path(str(path), what="workflow.dspy.program", search=Path(base_dir) if base_dir else None)
            hit = _AGENTS[path] = DSPyAgent(factory, inputs=spec["inputs"], output=spec.get("output"))
    return hit


def agent(task: dict, ctx: Any) -> Any:
    """The generic DSPy agent: runs the program named in ``workflow.dspy`` (see :func:`agent_for`)."""
    return agent_for(ctx.system.workflow)(task, ctx)


def _initial_prompts(workflow: Mapping[str, Any] | None = None, base_dir: str | Path | None = None) -> dict[str, str]:
    return agent_for(workflow or {}, base_dir).initial_prompts()


agent.initial_prompts = _initial_prompts  # type: ignore[attr-defined]


def as_dspy_agent(obj: Any, workflow: Mapping[str, Any], base_dir: str | Path | None = None) -> DSPyAgent:
    """The :class:`DSPyAgent` behind a task's agent (a ``DSPyAgent``, or the generic :func:`agent`)."""
    if isinstance(obj, DSPyAgent):
        return obj
    if obj is agent:
        return agent_for(workflow, base_dir)
    raise ConfigError(
        f"the task's agent {obj!r} is not a DSPy program; name one made by "
        "evolve.prompts.dspy_interop.dspy_agent(...) or evolve.prompts.dspy_interop:agent",
        path="agent",
    )


__all__ = [
    "DSPyAgent",
    "agent",
    "agent_for",
    "apply_components",
    "as_dspy_agent",
    "components_from_program",
    "demos_from_json",
    "dspy_agent",
    "import_dspy",
    "make_adapter",
    "openai_lm",
    "prediction_output",
    "program_inputs",
    "rollout_lm",
    "write_back",
]

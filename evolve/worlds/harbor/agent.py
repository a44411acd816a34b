"""The shell agent: read the instruction, run one command at a time in the task's environment, see
its output, stop with ``DONE``; then the task's tests run in the same environment.

The commands of an episode run in one persistent shell (a ``cd``, an export, a background service
carry over to the next command; on the sandbox backend the directory and exports do, see
:mod:`.environment.sandbox`). A multi-step task runs step by step in the same environment, each step a
fresh conversation opened with the step's instruction, scored as Harbor scores steps
(:mod:`.trial`).

The text protocol works with any chat model (a served one, litellm's, the tiny local one): each
reply holds one fenced block of bash (the first one is run; a reply with no block is run whole
unless it is ``DONE``), and the next message is the command's exit code and the tail of its output.
A reply that runs a block and also says ``DONE`` outside it ends the episode after that command.

Settings (``ctx.system.workflow``): ``max_turns`` (10), ``max_tokens`` (256), ``command_timeout``
(60 s, never more than what is left of the task's ``[agent] timeout_sec``), ``obs_chars`` (2000:
the output tail the model sees). Prompt component ``instruction`` is the system message
(:data:`DEFAULT_INSTRUCTION` when unset; an empty string sends none). With a memory
(``System.memory``), the most similar solved tasks and their commands come before the task. With
shell tools (``System.tools`` mined by toolforge, :mod:`.tools`), the system message lists them
and a reply that calls one (``NAME ARG ...``) runs its command, recorded as a call of ``NAME``.
"""

from __future__ import annotations

import contextvars
import re
import time
from typing import Any

from evolve.types import Message

DEFAULT_INSTRUCTION = (
    "You are a careful Linux shell agent working in a container. Reply with exactly one bash command in a "
    "```bash code block; you will see its exit code and output. Work in the directory named by the task. "
    "When the task is done, reply DONE."
)
_FENCE = re.compile(r"```[ \t]*(?:bash|sh|shell|console)?[ \t]*\n?(.*?)```", re.S)
_DONE = re.compile(r"^\s*(?:DONE|TASK[_ ]COMPLETE(?:D)?)\W*$", re.I)


def parse_reply(text: str) -> tuple[str | None, bool]:
    """``(command or None, done)`` from one reply (see the module docstring)."""
    text = text or ""
    m = _FENCE.search(text)
    if m:
        command = m.group(1).strip()
        rest = (text[: m.start()] + text[m.end() :]).strip()
        done = bool(re.search(r"\bDONE\b", rest))
        return (command or None), done
    stripped = text.strip()
    if stripped.startswith("```"):  # a block never closed (the reply was cut at max_tokens): its body
        stripped = stripped[3:].split("\n", 1)[1].strip() if "\n" in stripped else ""
        return (stripped or None), not stripped
    if not stripped or _DONE.match(stripped):
        return None, True
    if stripped.startswith("$ "):
        stripped = stripped[2:]
    return stripped, False


def observation(result: Any, obs_chars: int) -> str:
    """What the model sees after a command: its exit code (or that it was killed) and the tail of
    its output."""
    out = (result.stdout or "") + (("\n" if result.stdout and result.stderr else "") + (result.stderr or ""))
    out = out.strip()
    if len(out) > obs_chars:
        out = "…" + out[-obs_chars:]
    head = (
        f"killed: the command did not finish in {result.duration_s:.0f} s"
        if result.timed_out
        else f"exit code {result.exit_code}"
    )
    note = getattr(result, "note", "")
    return head + ("\n" + out if out else "\n(no output)") + (f"\n({note})" if note else "")


def recall_text(examples: list[dict]) -> str:
    lines = []
    for ex in examples:
        cmds = (ex.get("metadata") or {}).get("commands") or []
        if not cmds:
            continue
        lines.append(
            "A similar task solved before:\n"
            + ex["text"].strip()[:600]
            + "\nCommands that solved it:\n"
            + "\n".join(f"$ {c}" for c in cmds[:8])
        )
    return "\n\n".join(lines)


def messages_for(
    task: dict, instruction: str | None, examples: list[dict] | None = None, tools: dict[str, dict] | None = None
) -> list[Message]:
    """The messages an episode opens with (also the cold start's demos'); the system's shell
    shortcuts (:mod:`.tools`) are listed after the instruction."""
    from evolve.worlds.harbor.tools import menu

    system = DEFAULT_INSTRUCTION if instruction is None else instruction
    if tools:
        system = (system.rstrip() + "\n\n" if system.strip() else "") + menu(tools)
    out = [Message(role="system", content=system)] if system.strip() else []
    recalled = recall_text(examples or [])
    user = (recalled + "\n\nYour task:\n" if recalled else "") + task["instruction"]
    out.append(Message(role="user", content=user))
    return out


def _recall(spec: dict, query: str) -> list[dict]:
    from evolve.memory.recall import recall

    return recall(spec, query)


class Episode:
    """One episode's environment and settings, and what happened so far; :meth:`turn` is one
    reply of the model and the command it asked for (the hand-written loop and the workflow
    graph's ``harbor.act`` step, :mod:`.workflow`, both take turns through it)."""

    _current: contextvars.ContextVar[Episode | None] = contextvars.ContextVar("harbor_episode", default=None)

    def __init__(
        self, task: dict, ctx: Any, env: Any, tools: dict[str, dict], wf: dict, user: str | None = None
    ) -> None:
        self.task, self.ctx, self.env, self.tools, self.user = task, ctx, env, tools, user
        self.max_tokens = int(wf.get("max_tokens", 256))
        self.cap = float(wf.get("command_timeout", 60))
        self.obs_chars = int(wf.get("obs_chars", 2000))
        self.llm = ctx.llm("policy")
        budget = task.get("agent_timeout")  # None: no limit, as in Harbor
        self.t0, self.budget = time.monotonic(), float("inf") if budget is None else float(budget)
        self.commands: list[str] = []
        self.turns = 0
        self.said_done = self.timed_out = False

    @classmethod
    def current(cls) -> Episode:
        ep = cls._current.get()
        if ep is None:
            raise RuntimeError(
                "harbor workflow steps run only inside the harbor agent (agent: "
                "evolve.worlds.harbor:agent), which opens the task's environment"
            )
        return ep

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def reply(self, messages: list[Message], max_tokens: int | None = None) -> str:
        out = self.llm.complete(messages, max_tokens=max_tokens or self.max_tokens, stop=None)
        return getattr(out, "text", "") or ""

    def turn(self, messages: list[Message]) -> bool:
        """One reply and its command, appended to ``messages``; True when the episode is over (the
        agent said DONE, replied no command, or its time is spent)."""
        if self.left() <= 0:
            self.timed_out = True
            return True
        self.turns += 1
        reply = self.reply(messages)
        command, done = parse_reply(reply)
        messages.append(Message(role="assistant", content=reply))
        self.said_done = done
        if command is None:
            return True
        left = self.left()
        if left <= 0:
            self.timed_out = True
            return True
        timeout, env, ctx, user = round(min(self.cap, left), 1), self.env, self.ctx, self.user
        call = _shortcut_call(command, self.tools)
        if call is None:
            self.commands.append(command)
            r = ctx.tool(
                "shell", lambda command, timeout: _run(env, command, timeout, user), command=command, timeout=timeout
            )
            shown = observation(_Shown(r), self.obs_chars)
        elif isinstance(call, str):  # a shortcut called wrongly: the agent's own mistake, the turn spent
            shown = call
        else:
            name, kwargs, expanded = call
            self.commands.append(expanded)
            r = ctx.tool(name, lambda **kw: {**_run(env, expanded, timeout, user), "command": expanded}, **kwargs)
            shown = observation(_Shown(r), self.obs_chars)
        messages.append(Message(role="user", content=shown))
        return done


def agent(task: dict, ctx: Any) -> dict:
    """One episode of ``task`` (see the module docstring). Returns ``{"commands", "turns", "done",
    "agent_timed_out", "verifier": {score, components, source, exit_code, output, seconds[,
    steps]}, "backend", "shell_restarts"}``; an environment that fails raises
    :class:`~evolve.errors.InfraError`. With a workflow graph (``System.workflow["graph"]``, steps of
    :mod:`.workflow`) the graph takes the turns instead of the fixed loop."""
    from evolve.topology.graph import graph_of
    from evolve.worlds.harbor.environment import open_environment
    from evolve.worlds.harbor.tools import shortcuts
    from evolve.worlds.harbor.trial import run_episode, step_of

    system = ctx.system
    wf = dict(getattr(system, "workflow", None) or {})
    prompts = getattr(system, "prompts", None) or {}
    max_turns = max(1, int(wf.get("max_turns", 10)))
    spec = getattr(system, "memory", None) or {}
    examples = ctx.tool("recall_memory", _recall, spec=spec, query=task["instruction"]) if spec.get("store") else []
    tools = shortcuts(system)
    graph = graph_of(system)
    episodes: list[Episode] = []
    env = open_environment(task, task.get("backend", "auto"))

    def act(step: dict) -> None:
        view = {**task, "instruction": step["instruction"], "agent_timeout": step["agent_timeout"]}
        messages = messages_for(view, prompts.get("instruction"), examples, tools)
        ep = Episode(view, ctx, env, tools, wf, user=step.get("agent_user"))
        episodes.append(ep)
        if graph is None:
            for _ in range(max_turns):
                if ep.turn(messages):
                    break
            return
        from evolve.topology.runtime import Runtime

        token = Episode._current.set(ep)
        try:
            Runtime(ctx, graph).execute({"task": view, "messages": messages})
        finally:
            Episode._current.reset(token)

    def verify(step: dict | None) -> Any:
        args = {"task_id": task["id"]} if step is None else {"task_id": task["id"], "step": step["name"]}
        return ctx.tool("harbor.verify", lambda task_id, step=None: env.verify(step_of(task, step)), **args)

    try:
        out = run_episode(task, env, act, verify)
    finally:
        env.close()
    return {
        "commands": [c for ep in episodes for c in ep.commands],
        "turns": sum(ep.turns for ep in episodes),
        "done": bool(episodes) and episodes[-1].said_done,
        "agent_timed_out": any(ep.timed_out for ep in episodes),
        "verifier": out["verifier"],
        "backend": env.backend,
        "shell_restarts": getattr(env, "restarts", 0),
    }


def _shortcut_call(command: str, tools: dict[str, dict]) -> tuple[str, dict, str] | str | None:
    """``(name, kwargs, command it runs)`` when ``command`` calls one of ``tools``, a message saying
    what is wrong when it calls one wrongly, None when it is a plain command."""
    if not tools:
        return None
    from evolve.worlds.harbor.tools import expand, words

    ws = words(command)
    if not ws or ws[0] not in tools or any(set(w) <= set("();<>|&") for w in ws):
        return None
    tool = tools[ws[0]]
    try:
        expanded = expand(tool, ws[1:])
    except ValueError as e:
        return f"shortcut {ws[0]} {e}; nothing was run"
    return ws[0], dict(zip(tool["params"], ws[1:])), expanded


def _run(env: Any, command: str, timeout: float, user: str | None = None) -> dict:
    r = env.run(command, timeout=timeout, user=user)
    out = {
        "exit_code": r.exit_code,
        "stdout": r.stdout[-8000:],
        "stderr": r.stderr[-4000:],
        "timed_out": r.timed_out,
        "seconds": round(r.duration_s, 3),
    }
    if getattr(r, "note", ""):
        out["note"] = r.note
    return out


class _Shown:
    """A recorded shell step's result, read back as the observation shows it."""

    def __init__(self, d: dict) -> None:
        self.exit_code, self.stdout, self.stderr = d["exit_code"], d["stdout"], d["stderr"]
        self.timed_out, self.duration_s, self.note = d["timed_out"], d["seconds"], d.get("note", "")


def _reflexion_agent() -> Any:
    """The agent with Reflexion: the tests' output is the lesson's material; each attempt is a
    fresh environment. Attempts from ``workflow.reflexion_attempts`` (2)."""
    from evolve.reflexion import reflexion_agent as wrap

    fn = wrap(
        "evolve.worlds.harbor:agent",
        "evolve.worlds.harbor:reward",
        name="reflexion_agent",
        reflect="feedback",
        max_attempts=2,
    )
    fn.__module__ = "evolve.worlds.harbor"
    return fn


reflexion_agent = _reflexion_agent()  # ``agent: evolve.worlds.harbor:reflexion_agent`` in a task file

__all__ = ["DEFAULT_INSTRUCTION", "Episode", "agent", "messages_for", "observation", "parse_reply", "reflexion_agent"]

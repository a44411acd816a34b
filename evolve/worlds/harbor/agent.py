"""The shell agent: read the instruction, run one command at a time in the task's environment, see
its output, stop with ``DONE``; then the task's tests run in the same environment.

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
        rest = (text[:m.start()] + text[m.end():]).strip()
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
    head = (f"killed: the command did not finish in {result.duration_s:.0f} s" if result.timed_out
            else f"exit code {result.exit_code}")
    return head + ("\n" + out if out else "\n(no output)")


def recall_text(examples: list[dict]) -> str:
    lines = []
    for ex in examples:
        cmds = (ex.get("metadata") or {}).get("commands") or []
        if not cmds:
            continue
        lines.append("A similar task solved before:\n" + ex["text"].strip()[:600] + "\nCommands that solved it:\n"
                     + "\n".join(f"$ {c}" for c in cmds[:8]))
    return "\n\n".join(lines)


def messages_for(task: dict, instruction: str | None, examples: list[dict] | None = None,
                 tools: dict[str, dict] | None = None) -> list[Message]:
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


def agent(task: dict, ctx: Any) -> dict:
    """One episode of ``task`` (see the module docstring). Returns ``{"commands", "turns", "done",
    "agent_timed_out", "verifier": {score, components, source, exit_code, output, seconds},
    "backend"}``; an environment that fails raises :class:`~evolve.errors.InfraError`."""
    from evolve.worlds.harbor.environment import open_environment
    from evolve.worlds.harbor.tools import shortcuts

    system = ctx.system
    wf = dict(getattr(system, "workflow", None) or {})
    prompts = getattr(system, "prompts", None) or {}
    max_turns = max(1, int(wf.get("max_turns", 10)))
    max_tokens = int(wf.get("max_tokens", 256))
    cap = float(wf.get("command_timeout", 60))
    obs_chars = int(wf.get("obs_chars", 2000))
    spec = getattr(system, "memory", None) or {}
    examples = (ctx.tool("recall_memory", _recall, spec=spec, query=task["instruction"])
                if spec.get("store") else [])
    tools = shortcuts(system)
    messages = messages_for(task, prompts.get("instruction"), examples, tools)
    llm = ctx.llm("policy")
    env = open_environment(task, task.get("backend", "auto"))
    commands: list[str] = []
    done = timed_out = False
    turn = 0
    try:
        t0 = time.monotonic()
        budget = float(task["agent_timeout"])
        for turn in range(1, max_turns + 1):
            left = budget - (time.monotonic() - t0)
            if left <= 0:
                timed_out = True
                break
            reply = getattr(llm.complete(messages, max_tokens=max_tokens, stop=None), "text", "") or ""
            command, done = parse_reply(reply)
            messages.append(Message(role="assistant", content=reply))
            if command is None:
                break
            left = budget - (time.monotonic() - t0)
            if left <= 0:
                timed_out = True
                break
            timeout = round(min(cap, left), 1)
            call = _shortcut_call(command, tools)
            if call is None:
                commands.append(command)
                r = ctx.tool("shell", lambda command, timeout: _run(env, command, timeout), command=command,
                             timeout=timeout)
                shown = observation(_Shown(r), obs_chars)
            elif isinstance(call, str):  # a shortcut called wrongly: the agent's own mistake, the turn spent
                shown = call
            else:
                name, kwargs, expanded = call
                commands.append(expanded)
                r = ctx.tool(name, lambda **kw: {**_run(env, expanded, timeout), "command": expanded}, **kwargs)
                shown = observation(_Shown(r), obs_chars)
            messages.append(Message(role="user", content=shown))
            if done:
                break
        verdict = ctx.tool("harbor.verify", lambda task_id: env.verify(), task_id=task["id"])
    finally:
        env.close()
    return {"commands": commands, "turns": turn, "done": done, "agent_timed_out": timed_out,
            "verifier": verdict, "backend": env.backend}


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


def _run(env: Any, command: str, timeout: float) -> dict:
    r = env.exec(command, timeout=timeout)
    return {"exit_code": r.exit_code, "stdout": r.stdout[-8000:], "stderr": r.stderr[-4000:],
            "timed_out": r.timed_out, "seconds": round(r.duration_s, 3)}


class _Shown:
    """A recorded shell step's result, read back as the observation shows it."""

    def __init__(self, d: dict) -> None:
        self.exit_code, self.stdout, self.stderr = d["exit_code"], d["stdout"], d["stderr"]
        self.timed_out, self.duration_s = d["timed_out"], d["seconds"]


def _reflexion_agent() -> Any:
    """The agent with Reflexion: the tests' output is the lesson's material; each attempt is a
    fresh environment. Attempts from ``workflow.reflexion_attempts`` (2)."""
    from evolve.reflexion import reflexion_agent as wrap

    fn = wrap("evolve.worlds.harbor:agent", "evolve.worlds.harbor:reward", name="reflexion_agent", reflect="feedback",
              max_attempts=2)
    fn.__module__ = "evolve.worlds.harbor"
    return fn


reflexion_agent = _reflexion_agent()  # ``agent: evolve.worlds.harbor:reflexion_agent`` in a task file

__all__ = ["DEFAULT_INSTRUCTION", "agent", "messages_for", "observation", "parse_reply", "reflexion_agent"]

"""What the layers learn from Harbor episodes: memory entries from solved ones (the instruction,
and the commands that solved it), and SFT demos from the tasks' own solutions (a local model's cold
start)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from evolve.worlds.harbor.agent import DEFAULT_INSTRUCTION, messages_for


def experiences(trajectories: Sequence[Any], tasks: dict[str, dict], *, threshold: float = 1.0) -> list[dict]:
    """Memory entries (``kind, text, metadata``) for solved trajectories: the instruction as text,
    the commands that solved it in the metadata; one per task and command list."""
    out, seen = [], set()
    for t in trajectories:
        task = tasks.get(t.task_id)
        cmds = t.output.get("commands") if isinstance(t.output, dict) else None
        if task is None or t.error is not None or t.score < threshold or not cmds:
            continue
        key = (t.task_id, tuple(cmds))
        if key in seen:
            continue
        seen.add(key)
        out.append(
            {
                "kind": "experience",
                "text": task["instruction"],
                "metadata": {"commands": list(cmds)[:12], "task_id": t.task_id},
            }
        )
    return out


def solution_commands(task: dict) -> list[str]:
    """The commands of ``solution/solve.sh`` (comments, the shebang and ``set`` lines dropped);
    a line ending in ``\\`` or inside a heredoc joins the next."""
    from evolve.sandbox.beneath import Refused, read

    try:  # a task's own file: read without following links
        data = read(task["path"], "solution/solve.sh", limit=1 << 20)
    except (Refused, OSError):
        data = None
    if data is None:
        return []
    cmds: list[str] = []
    buf: list[str] = []
    heredoc: str | None = None
    for line in data.decode("utf-8", "replace").splitlines():
        if heredoc is not None:
            buf.append(line)
            if line.strip() == heredoc:
                cmds.append("\n".join(buf))
                buf, heredoc = [], None
            continue
        s = line.strip()
        if not buf and (not s or s.startswith("#") or re.fullmatch(r"set\s+-[euxo\s\w]+", s)):
            continue
        buf.append(line.rstrip())
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if m:
            heredoc = m.group(1)
            continue
        if s.endswith("\\"):
            continue
        cmds.append("\n".join(buf))
        buf = []
    if buf:
        cmds.append("\n".join(buf))
    return cmds


def demos(
    tasks: list[dict], *, instruction: str | None = None, seed: int = 0, augment: int = 0, **_: Any
) -> list[list[dict[str, str]]]:
    """Chat demos in the agent's message format from the tasks' own solutions: the opening
    messages, then one reply per solution command (each in a bash block) with a successful
    observation between, then ``DONE``. Tasks without a solution give none."""
    out = []
    for task in tasks:
        cmds = solution_commands(task)
        if not cmds:
            continue
        chat = [m.model_dump() for m in messages_for(task, DEFAULT_INSTRUCTION if instruction is None else instruction)]
        for c in cmds:
            chat += [
                {"role": "assistant", "content": f"```bash\n{c}\n```"},
                {"role": "user", "content": "exit code 0\n(no output)"},
            ]
        chat.append({"role": "assistant", "content": "DONE"})
        out.append(chat)
    return out


__all__ = ["demos", "experiences", "solution_commands"]

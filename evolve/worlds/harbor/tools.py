"""Shell tools mined from the commands that solved Harbor tasks (the world's ``tools.mine`` hook).

A command that recurs across solved tasks with only its arguments changing becomes a
parametrised shortcut: ``wc -l < /app/data_3.txt > /app/count.txt`` in one task and
``wc -l < /app/data_8.txt > /app/count.txt`` in two more give ``wc_l PATH``, which runs
``wc -l < PATH > /app/count.txt`` (what stays the same in every case stays literal). The agent
offers the system's shortcuts in its system message and expands a reply that calls one into the
command, quoted, and runs that in the task's environment (:mod:`.agent`).

A shortcut is a :class:`~evolve.toolforge.tool.Tool` like any other: its code builds the command
string, and the toolforge operator admits it only after that code, run in the sandbox,
reproduces every recorded command it claims (``tests``). The agent expands the template in
``meta`` (string quoting, no code of the tool runs on the host).

What is mined: single-line commands of solved episodes (score at or above ``threshold``) that
parse as shell words (no heredoc, no command substitution). A command's shape keeps its program
names, options (words starting with ``-``) and operators (``|``, ``>``, ``&&`` ...); each other
word is a slot, kept literal when all cases agree and a parameter when they differ.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from evolve.types import ToolCall

SOURCE_TOOL = "shell"
_OPS = set("();<>|&")
_UNSAFE = re.compile(r"\$\(|`|<<|\n")
TOOL_CODE = '''import shlex

PARTS = {parts!r}


def {name}({signature}):
    """{doc}"""
    values = {{{values}}}
    out = []
    for kind, text in PARTS:
        if kind == "param":
            value = values[text]
            if not isinstance(value, str) or not value:
                raise ValueError(text + " must be a non-empty string, got " + repr(value))
            out.append(shlex.quote(value))
        else:
            out.append(text)
    return " ".join(out)
'''


def words(command: str) -> list[str] | None:
    """The shell words and operators of ``command``, or None when it is not a simple one-liner."""
    if not isinstance(command, str) or not command.strip() or _UNSAFE.search(command):
        return None
    lex = shlex.shlex(command, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:  # an unclosed quote
        return None


def is_op(word: str) -> bool:
    return bool(word) and set(word) <= _OPS


def canonical(ws: Sequence[str]) -> str:
    """The command for words ``ws``: operators as they are, every other word quoted as needed."""
    return " ".join(w if is_op(w) else shlex.quote(w) for w in ws)


def _skeleton(ws: list[str]) -> tuple[tuple[str, ...], list[int]] | None:
    """The shape key (slots as ``\\0``) and the indexes of the slots: a word that is not an operator,
    an option or a command's program name."""
    key, slots, first = [], [], True
    for i, w in enumerate(ws):
        if is_op(w):
            key.append(w)
            first = w not in (">", ">>", "<", "2>", "&>")  # after a redirection comes a file, not a program
            continue
        if first or w.startswith("-"):
            key.append(w)
        else:
            key.append("\0")
            slots.append(i)
        first = False
    if not slots or canonical(ws) != canonical(words(canonical(ws)) or []):
        return None
    return tuple(key), slots


def _name(ws: list[str], taken: set[str]) -> str:
    prog = re.sub(r"\W", "_", ws[0].rsplit("/", 1)[-1]).strip("_").lower() or "cmd"
    opt = next((w.lstrip("-") for w in ws[1:3] if w.startswith("-") and len(w) > 1), "")
    base = re.sub(r"\W", "_", f"{prog}_{opt}" if opt else prog)[:40].strip("_") or "cmd"
    if base[0].isdigit():
        base = "t_" + base
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def _param_name(values: list[str], used: dict[str, int]) -> str:
    stem = "path" if all("/" in v for v in values) else "n" if all(v.isdigit() for v in values) else "arg"
    used[stem] = used.get(stem, 0) + 1
    return stem if used[stem] == 1 else f"{stem}{used[stem]}"


def successful_commands(trajectories: Sequence[Any], *, tool: str = SOURCE_TOOL, threshold: float = 1.0):
    """(task_id, command) for each command of each solved trajectory, in order."""
    for t in trajectories:
        if t.error is not None or t.score < threshold:
            continue
        for s in t.steps:
            if isinstance(s, ToolCall) and s.name == tool and s.error is None:
                cmd = (s.args or {}).get("command")
                if isinstance(cmd, str):
                    yield t.task_id, cmd


def mine_commands(
    trajectories: Sequence[Any],
    *,
    tool: str = SOURCE_TOOL,
    min_support: int = 3,
    threshold: float = 1.0,
    max_cases: int = 6,
    max_tools: int = 10,
    taken: Sequence[str] = (),
    provenance: dict | None = None,
    **_: Any,
) -> list[Any]:
    """Shortcuts for the command shapes that solved at least ``min_support`` distinct tasks with
    differing arguments, most supported first (see the module docstring)."""
    from evolve.toolforge.tool import Tool, ToolCase

    groups: dict[tuple[str, ...], list[tuple[str, list[str], list[int]]]] = defaultdict(list)
    for task_id, cmd in successful_commands(trajectories, tool=tool, threshold=threshold):
        ws = words(cmd)
        sk = _skeleton(ws) if ws else None
        if ws and sk is not None:
            groups[sk[0]].append((task_id, ws, sk[1]))
    ranked = sorted(groups.items(), key=lambda kv: (-len({t for t, _, _ in kv[1]}), kv[0]))
    out: list[Tool] = []
    names = set(taken)
    for _key, cases in ranked:
        if len({t for t, _, _ in cases}) < min_support or len(out) >= max_tools:
            continue
        slots = cases[0][2]
        varying = [j for j in range(len(slots)) if len({ws[idx[j]] for _, ws, idx in cases}) > 1]
        if not varying:
            continue
        used: dict[str, int] = {}
        pnames = {j: _param_name([ws[idx[j]] for _, ws, idx in cases], used) for j in varying}
        first_ws, first_idx = cases[0][1], cases[0][2]
        slot_of = {i: j for j, i in enumerate(first_idx)}
        parts: list[tuple[str, str]] = []
        for i, w in enumerate(first_ws):
            j = slot_of.get(i)
            piece = ("param", pnames[j]) if j in pnames else ("lit", w if is_op(w) else shlex.quote(w))
            if piece[0] == "lit" and parts and parts[-1][0] == "lit":
                parts[-1] = ("lit", parts[-1][1] + " " + piece[1])
            else:
                parts.append(piece)
        params = tuple(pnames[j] for j in varying)
        name = _name(first_ws, names)
        names.add(name)
        shown = " ".join(p.upper() if k == "param" else p for k, p in parts)
        doc = f"runs: {shown}"
        code = TOOL_CODE.format(
            parts=parts,
            name=name,
            signature=", ".join(params),
            doc=doc.replace('"""', "'''").replace("\\", "\\\\"),
            values=", ".join(f"{p!r}: {p}" for p in params),
        )
        seen: set[str] = set()
        tests: list[ToolCase] = []
        for tid, ws, idx in cases:
            if tid in seen or len(tests) >= max_cases:
                continue
            seen.add(tid)
            tests.append(
                ToolCase(
                    kwargs={pnames[j]: ws[idx[j]] for j in varying}, expect=canonical(ws), source=f"recorded:{tid}"
                )
            )
        prov = {
            **(provenance or {}),
            "trajectories": sorted({t for t, _, _ in cases})[:50],
            "support": len({t for t, _, _ in cases}),
        }
        out.append(
            Tool(
                name=name,
                params=params,
                doc=doc,
                code=code,
                function=name,
                tests=tuple(tests),
                origin="abstraction",
                provenance=prov,
                meta={"kind": "shell", "parts": [list(p) for p in parts], "support": prov["support"]},
            )
        )
    return out


def shortcuts(system: Any) -> dict[str, dict]:
    """The system's shell tools by name (``{"params", "parts", "doc"}``)."""
    out = {}
    for name, t in (getattr(system, "tools", None) or {}).items():
        meta = t.get("meta") or {} if isinstance(t, dict) else {}
        if meta.get("kind") == "shell" and isinstance(meta.get("parts"), list):
            out[name] = {"params": list(t.get("params") or []), "parts": meta["parts"], "doc": t.get("doc", "")}
    return out


def expand(tool: dict, args: list[str]) -> str:
    """The command a shortcut call runs: the template with ``args`` quoted, or ValueError."""
    if len(args) != len(tool["params"]):
        raise ValueError(
            f"takes {len(tool['params'])} argument(s) ({' '.join(p.upper() for p in tool['params'])}), got {len(args)}"
        )
    values = dict(zip(tool["params"], args))
    out = []
    for kind, text in tool["parts"]:
        if kind == "param":
            if not values[text]:
                raise ValueError(f"{text.upper()} is empty")
            out.append(shlex.quote(values[text]))
        else:
            out.append(text)
    return " ".join(out)


def menu(tools: dict[str, dict]) -> str:
    """The shortcuts as the system message lists them."""
    lines = [f"- {name} {' '.join(p.upper() for p in t['params'])}: {t['doc']}" for name, t in sorted(tools.items())]
    return "Shortcuts you can run as commands:\n" + "\n".join(lines)


__all__ = ["SOURCE_TOOL", "canonical", "expand", "menu", "mine_commands", "shortcuts", "successful_commands", "words"]

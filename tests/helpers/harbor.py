"""Generated Harbor task families and a scripted chat model that plays them, for the harbor world's
end-to-end tests (a real OpenAI-compatible server over loopback answers with :func:`respond`); and
what the harbor tests share: the sandbox backend for a test (:func:`use_sandbox`), one scripted
episode (:func:`play`) and its shell results (:func:`shells`).

Three families, each task a real Harbor folder checked by its own solution:

* ``count`` — "write the number of lines of /app/data_N.txt to /app/count.txt": the model always
  solves it;
* ``word`` — "write the word W to /app/word.txt": the tests need a trailing newline and say so;
  the model writes one only when its system prompt says to end files with a newline (a lesson the
  reflective operator can carry from the tests' feedback into the instruction);
* ``secret`` — "decode /app/secret_N.b64 into /app/secret.txt": the model knows ``base64 -d`` only
  for even N, or when a recalled solved task shows it (what the memory layer gives).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from evolve.llm.fake import ScriptedLM
from evolve.rollout import run_agent, score
from evolve.types import ModelSpec, System

WORDS = [
    "apple",
    "banana",
    "cherry",
    "delta",
    "echo",
    "falcon",
    "garnet",
    "harbor",
    "indigo",
    "jasper",
    "kiwi",
    "lemon",
    "mango",
    "nectar",
    "olive",
    "pepper",
]
LESSON = "Always end the files you write with a newline."

_TOML = """schema_version = "1.1"
[task]
name = "test/{name}"
[metadata]
family = "{family}"
[verifier]
timeout_sec = 20
[agent]
timeout_sec = 60
[environment]
build_timeout_sec = 30
memory_mb = 512
"""


def _task(root: Path, name: str, family: str, instruction: str, files: dict[str, str], test: str, solve: str) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "instruction.md").write_text(instruction + "\n")
    (d / "task.toml").write_text(_TOML.format(name=name, family=family))
    lines = ["FROM python:3.11-slim", "WORKDIR /app"]
    for fname, text in files.items():
        (d / "environment" / fname).write_text(text)
        lines.append(f"COPY {fname} /app/{fname}")
    (d / "environment" / "Dockerfile").write_text("\n".join(lines) + "\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\nmkdir -p /logs/verifier\n" + test)
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve + "\n")
    return d


def _verdict(cond: str, fail_msg: str) -> str:
    return (
        f"if {cond}; then echo 1 > /logs/verifier/reward.txt; echo passed; exit 0; fi\n"
        f"echo 0 > /logs/verifier/reward.txt; echo {fail_msg!r}; exit 1\n"
    )


def make_tasks(root: Path, n: int = 10) -> dict[str, list[str]]:
    """``n`` tasks of each family under ``root``; returns ``{family: [task ids]}``."""
    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[str]] = {"count": [], "word": [], "secret": []}
    for i in range(n):
        lines = "".join(f"row {j}\n" for j in range(3 + 2 * i))
        _task(
            root,
            f"count-{i}",
            "count",
            f"Write the number of lines of /app/data_{i}.txt to /app/count.txt.",
            {f"data_{i}.txt": lines},
            _verdict(
                f'[ "$(tr -d "[:space:]" < /app/count.txt 2>/dev/null)" = "{3 + 2 * i}" ]',
                "count.txt does not hold the right number of lines",
            ),
            f"wc -l < /app/data_{i}.txt > /app/count.txt",
        )
        out["count"].append(f"count-{i}")
        w = WORDS[i % len(WORDS)]
        _task(
            root,
            f"word-{i}",
            "word",
            f"Write the word {w} to /app/word.txt.",
            {"README": "word task\n"},
            f'if [ -f /app/word.txt ] && [ "$(cat /app/word.txt)" = "{w}" ] && [ -z "$(tail -c1 /app/word.txt)" ]; then\n'
            "  echo 1 > /logs/verifier/reward.txt; echo passed; exit 0; fi\n"
            'if [ -f /app/word.txt ] && [ "$(cat /app/word.txt)" = "' + w + '" ]; then\n'
            "  echo 0 > /logs/verifier/reward.txt; echo 'word.txt has the right word but must end with a newline'; "
            "exit 1; fi\n"
            "echo 0 > /logs/verifier/reward.txt; echo 'word.txt does not hold the word'; exit 1\n",
            f"echo {w} > /app/word.txt",
        )
        out["word"].append(f"word-{i}")
        secret = f"s3cret-{i}-{WORDS[(i * 7) % len(WORDS)]}"
        _task(
            root,
            f"secret-{i}",
            "secret",
            f"Decode the base64 file /app/secret_{i}.b64 and write the decoded text to /app/secret.txt.",
            {f"secret_{i}.b64": base64.b64encode(secret.encode()).decode() + "\n"},
            _verdict(
                f'[ "$(cat /app/secret.txt 2>/dev/null)" = "{secret}" ]', "secret.txt does not hold the decoded text"
            ),
            f"base64 -d /app/secret_{i}.b64 > /app/secret.txt",
        )
        out["secret"].append(f"secret-{i}")
    return out


def _fenced(text: str) -> str:
    m = re.search(r"```[a-z]*\n?(.*?)```", text, re.S)
    return m.group(1).strip() if m else text.strip()


def respond(messages: list[dict]) -> str:
    """The scripted model: the policy's shell replies and the reflection LLM's rewrites."""
    first = messages[0]["content"] if messages else ""
    if first.startswith("I gave an assistant the following"):  # the reflective operator
        current = _fenced(first)
        lesson = LESSON if "must end with a newline" in first and LESSON not in current else ""
        return "```\n" + (current + ("\n" + lesson if lesson else "")).strip() + "\n```"
    if messages[-1]["role"] == "user" and messages[-1]["content"].startswith(("exit code", "killed")):
        return "DONE"
    system = first if messages[0]["role"] == "system" else ""
    user = [m["content"] for m in messages if m["role"] == "user"][-1]
    task = user.split("Your task:\n")[-1]
    if m := re.search(r"lines of /app/(data_\d+\.txt)", task):
        return f"```bash\nwc -l < /app/{m.group(1)} > /app/count.txt\n```"
    if m := re.search(r"Write the word (\w+) to /app/word\.txt", task):
        cmd = f"echo {m.group(1)} > /app/word.txt" if LESSON in system else f"printf '%s' {m.group(1)} > /app/word.txt"
        return f"```bash\n{cmd}\n```"
    if m := re.search(r"/app/secret_(\d+)\.b64", task):
        n = int(m.group(1))
        recalled = re.search(r"\$ (base64 -d /app/secret_\d+\.b64 > /app/secret\.txt)", user)
        if recalled:
            return "```bash\n" + re.sub(r"secret_\d+", f"secret_{n}", recalled.group(1)) + "\n```"
        if n % 2 == 0:
            return f"```bash\nbase64 -d /app/secret_{n}.b64 > /app/secret.txt\n```"
        return f"```bash\ncat /app/secret_{n}.b64 > /app/secret.txt\n```"
    return "DONE"


def write(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``root``: a task folder for a test."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def use_sandbox(monkeypatch) -> None:
    """The harbor world on its sandbox backend (``auto`` included); skip where bubblewrap cannot run."""
    from evolve.sandbox.shell import available

    why = available()
    if why:
        pytest.skip(f"bubblewrap sandbox unavailable: {why}")
    monkeypatch.setenv("EVOLVE_HARBOR_BACKEND", "sandbox")


def play(task: dict, replies: list[str], workflow: dict | None = None):
    """One episode of the world's shell agent with a scripted model; the trajectory scored by the world's reward."""
    from evolve.worlds.harbor import reward
    from evolve.worlds.harbor.agent import agent

    llm = ScriptedLM("m", replies, cycle=False)
    system = System(models={"policy": ModelSpec(backend="scripted", name="m")}, workflow=workflow or {})
    return score(reward, task, run_agent(agent, system, task, lambda s, r: llm))


def shells(traj) -> list[dict]:
    """The results of an episode's shell commands."""
    return [s.result for s in traj.steps if getattr(s, "name", None) == "shell"]

"""The Python API as the README documents it: a task given as a dict with functions for agent and
reward, evolve.load given them back, and the README's snippet run as printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import evolve
from evolve.errors import UserError
from evolve.types import Message

ROOT = Path(__file__).resolve().parents[2]


def _agent(task, ctx):
    msgs = [
        Message(role="system", content=ctx.system.prompts["instruction"]),
        Message(role="user", content=f"{task['a']} {task['b']}"),
    ]
    return ctx.llm("policy").complete(msgs).text.strip()


def _reward(task, output):
    return float(output == str(task["answer"]))


def _task(**changes) -> dict:
    task = {
        "name": "adder",
        "agent": _agent,
        "reward": _reward,
        "models": {"policy": {"backend": "scripted", "name": "toy", "params": {"reply": "evolve.worlds.toy:reply"}}},
        "prompts": {"instruction": "multiply"},
        "dataset": {"source": "evolve.worlds.toy:dataset"},
        "operators": [
            {"name": "scripted", "params": {"component": "instruction", "choices": ["add", "add carefully"]}}
        ],
        "budget": {"generations": 2},
    }
    task.update(changes)
    return task


def test_a_dict_with_functions_runs_resumes_and_loads(tmp_path):
    report = evolve.run(_task(), out=tmp_path / "r")
    assert report["baseline"]["test"]["score"] == 0.05 and report["best"]["test"]["score"] == 1.0
    again = evolve.run(_task(), out=tmp_path / "r", resume=True)  # the functions' names are the fingerprint
    assert again["best"]["system_id"] == report["best"]["system_id"]
    app = evolve.load(tmp_path / "r", agent=_agent, reward=_reward)
    assert app.run({"id": "q", "a": 2, "b": 3}) == "5"
    assert evolve.load(tmp_path / "r").run({"id": "q", "a": 2, "b": 3}) == "5"  # importable by name: found again
    # functions given as keywords fill in a dict that leaves them out
    task = _task()
    del task["agent"], task["reward"]
    other = evolve.run(task, agent=_agent, reward=_reward, out=tmp_path / "r2")
    assert other["best"]["system_id"] == report["best"]["system_id"]
    with pytest.raises(UserError, match="gives agent twice"):
        evolve.run(_task(), agent=_reward, out=tmp_path / "r3")


def test_load_asks_for_a_function_it_cannot_import(tmp_path):
    def local_agent(task, ctx):  # nested: its name cannot be imported
        return _agent(task, ctx)

    evolve.run(_task(agent=local_agent), out=tmp_path / "r")
    with pytest.raises(UserError, match=r"pass it: evolve.load\(\.\.\., agent=your_agent\)"):
        evolve.load(tmp_path / "r")
    assert evolve.load(tmp_path / "r", agent=local_agent).run({"id": "q", "a": 1, "b": 1}) == "2"


def test_the_readme_python_snippet_runs_as_printed(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Bring your own agent") :]
    code = re.search(r"```python runnable\n(.*?)```", section, re.S).group(1)
    (tmp_path / "snippet.py").write_text(code)
    r = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "{'score': 0.05, 'n': 20} {'score': 1.0, 'n': 20}"
    assert lines[1] == "add carefully 5"

"""The harbor world's tools.mine hook: commands that solved several tasks with only their
arguments changing become shell shortcuts, admitted by toolforge only when their code (run in the
sandbox) reproduces every recorded command; the agent lists the system's shortcuts and runs a
call of one as its command, recorded under the shortcut's name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import evolve
from evolve.archive import Archive
from evolve.types import Reward, ToolCall, Trajectory
from evolve.worlds.harbor.tools import canonical, expand, menu, mine_commands, shortcuts, words
from tests.helpers.harbor import make_tasks, respond, use_sandbox

REPO = Path(__file__).parents[2]


def _traj(task_id: str, *commands: str, score: float = 1.0) -> Trajectory:
    steps = [ToolCall(name="shell", args={"command": c, "timeout": 30}, result={"exit_code": 0}) for c in commands]
    return Trajectory(task_id=task_id, system_id="s", steps=steps, output={}, reward=Reward(score=score))


def test_recurring_commands_become_shortcuts_with_what_varies_as_parameters():
    trajs = [_traj(f"count-{i}", "cd /app", f"wc -l < /app/data_{i}.txt > /app/count.txt") for i in range(4)]
    trajs += [_traj("count-9", "wc -l < /app/data_9.txt > /app/count.txt", score=0.0)]  # unsolved: not mined
    trajs += [_traj(f"secret-{i}", f"base64 -d '/app/secret {i}.b64' > /app/secret.txt") for i in range(3)]
    trajs += [_traj("other", "echo $(date) > x", "cat <<EOF\nhi\nEOF")]  # not simple one-liners
    tools = {t.name: t for t in mine_commands(trajs, min_support=3, taken=["base64_d"])}
    assert set(tools) == {"wc_l", "base64_d_2"}  # "cd /app" never varies; a taken name gets a suffix
    wc = tools["wc_l"]
    assert wc.params == ("path",) and wc.doc == "runs: wc -l < PATH > /app/count.txt"
    assert [c.kwargs for c in wc.tests] == [{"path": f"/app/data_{i}.txt"} for i in range(4)]
    assert wc.tests[0].expect == "wc -l < /app/data_0.txt > /app/count.txt" and wc.provenance["support"] == 4
    b = tools["base64_d_2"]
    assert b.tests[1].expect == "base64 -d '/app/secret 1.b64' > /app/secret.txt"
    assert mine_commands(trajs, min_support=5) == []


def test_admission_runs_the_code_in_the_sandbox_and_the_expansion_is_quoted():
    from evolve.toolforge.validate import check, default_sandbox

    trajs = [_traj(f"t{i}", f"grep -c {w} /app/log_{i}.txt") for i, w in enumerate(["ERROR", "WARN", '"it\'s"'])]
    (tool,) = mine_commands(trajs, min_support=3)
    assert tool.params == ("arg", "path")
    verdict = check(tool, default_sandbox("process"), [], min_recorded=len(tool.tests))
    assert verdict.admitted, verdict.summary()
    wrong = tool.model_copy(update={"code": tool.code.replace('" ".join(out)', '"  ".join(out)')})
    assert not check(wrong, default_sandbox("process"), [], min_recorded=len(wrong.tests)).admitted
    lib = {"grep_c": tool.model_dump()}
    sc = shortcuts(type("S", (), {"tools": lib})())
    assert expand(sc["grep_c"], ["a b; rm -rf /", "/app/x"]) == "grep -c 'a b; rm -rf /' /app/x"
    with pytest.raises(ValueError, match="takes 2 argument"):
        expand(sc["grep_c"], ["x"])
    assert "- grep_c ARG PATH: runs: grep -c ARG PATH" in menu(sc)
    assert words("ls | wc -l") == ["ls", "|", "wc", "-l"] and canonical(["echo", "a b", ">", "f"]) == "echo 'a b' > f"


@pytest.fixture
def sandboxed(monkeypatch, loopback_env):
    """The harbor world's sandbox backend (skipped where bubblewrap cannot run), a model on loopback."""
    use_sandbox(monkeypatch)


def _family(root: Path, family: str, sizes: tuple[int, int]) -> dict:
    """Eight tasks of one generated family under ``root`` (the others removed): the first ``sizes[0]``
    for train, the next ``sizes[1]`` for val, the rest for test."""
    import shutil

    fams = make_tasks(root, 8)
    for name, ids in fams.items():
        if name != family:
            for tid in ids:
                shutil.rmtree(root / tid)
    ids, (a, b) = fams[family], sizes
    return {"train": ids[:a], "val": ids[a : a + b], "test": ids[a + b :]}


def _served(respond_fn, tmp_path: Path, out: str, splits: dict, *extra: str) -> dict:
    """examples/harbor/task.yaml over the tasks in tmp_path/tasks, the policy a scripted model served
    on loopback through litellm."""
    from tests.helpers.servers import FakeOpenAI

    srv = FakeOpenAI(respond=respond_fn)
    policy = {
        "backend": "litellm",
        "name": "openai/scripted",
        "params": {"api_base": srv.base, "max_retries": 0, "timeout": 10, "temperature": 0.0},
    }
    try:
        return evolve.run(
            REPO / "examples" / "harbor" / "task.yaml",
            out=tmp_path / out,
            overrides=[
                f"models.policy={json.dumps(policy)}",
                f"dataset.source={tmp_path / 'tasks'}",
                f"dataset.params.splits={json.dumps(splits)}",
                "prompts={}",
                *extra,
            ],
        )
    finally:
        srv.close()


def _with_shortcuts(messages: list[dict]) -> str:
    """The scripted model of tests/helpers/harbor.py, which calls a listed shortcut for count tasks."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    shortcut = re.search(r"^- (\w+) PATH: runs: wc -l < PATH > /app/count\.txt$", system, re.M)
    task = [m["content"] for m in messages if m["role"] == "user"][-1] if messages else ""
    if shortcut and messages[-1]["role"] == "user" and not task.startswith(("exit code", "killed", "shortcut")):
        if m := re.search(r"lines of (/app/data_\d+\.txt)", task):
            return f"```bash\n{shortcut.group(1)} {m.group(1)}\n```"
    return respond(messages)


def test_toolforge_mines_a_shortcut_from_a_harbor_run_and_the_agent_runs_it(tmp_path, sandboxed):
    """The harbor world's tools.mine over a served model (an OpenAI-compatible server on loopback):
    the count tasks' solved commands become `wc_l PATH`, admitted in the sandbox; the evolved
    system lists it, the model calls it, the call runs `wc -l < PATH > /app/count.txt` in the task's
    environment and the task's own tests pass."""
    splits = _family(tmp_path / "tasks", "count", (5, 2))
    rep = _served(
        _with_shortcuts,
        tmp_path,
        "run",
        splits,
        "workflow={max_turns: 3, max_tokens: 128}",
        "operators=[{name: toolforge, params: {min_support: 3, patience: 5}}]",
        "budget.generations=1",
        "engine.minibatch=5",
        "engine.min_gain=-1",
    )
    archive = Archive(tmp_path / "run")
    tools = [r for r in archive.records() if r.operator == "toolforge"]
    assert tools, "toolforge proposed nothing"
    child = archive.get_system(tools[0].id)
    assert set(child.tools) == {"wc_l"} and child.tools["wc_l"]["meta"]["kind"] == "shell"
    trajs = archive.trajectories(child.id, "val")
    assert trajs and all(t.score == 1.0 and t.infra is None for t in trajs)
    for t in trajs:
        (call,) = [s for s in t.steps if isinstance(s, ToolCall) and s.name == "wc_l"]
        n = t.task_id.split("-")[1]
        assert call.args == {"path": f"/app/data_{n}.txt"}
        assert call.result["command"] == f"wc -l < /app/data_{n}.txt > /app/count.txt"
        assert not [s for s in t.steps if isinstance(s, ToolCall) and s.name == "shell"]
    assert rep["baseline"]["val"]["score"] == 1.0


# ----------------------------------------------------------------------------- the topology palette


def _reviewer(messages: list[dict]) -> str:
    """Writes the word without its newline at first; asked to review, checks the file and fixes it."""
    from evolve.worlds.harbor.workflow import REVIEW_PROMPT

    last = messages[-1]["content"] if messages else ""
    task = next((m["content"] for m in messages if m["role"] == "user"), "")
    w = re.search(r"Write the word (\w+) to /app/word\.txt", task)
    if w is None:
        return respond(messages)
    if last == REVIEW_PROMPT:
        return f"```bash\necho {w.group(1)} > /app/word.txt\n```\nDONE"
    if messages[-1]["role"] == "user" and last.startswith(("exit code", "killed")):
        return "DONE"
    return f"```bash\nprintf '%s' {w.group(1)} > /app/word.txt\n```"


def test_the_topology_search_finds_the_review_loop_the_tasks_need(tmp_path, sandboxed):
    """The harbor world's palette over its agent's graph (examples/harbor/task.yaml, a served model
    on loopback): the word tasks' tests need a trailing newline that the model only adds when asked
    to review its work, so the search adds the review loop, and the child solves held-out tasks
    the parent fails; the graph with no edit runs exactly as the hand-written loop."""
    from evolve.worlds.harbor.workflow import shell_loop

    splits = _family(tmp_path / "tasks", "word", (4, 2))
    plain = _served(
        _reviewer,
        tmp_path,
        "plain",
        splits,
        "engine.minibatch=4",
        "workflow={max_turns: 3, max_tokens: 128}",
        "operators=[]",
        "budget.generations=0",
    )
    rep = _served(
        _reviewer,
        tmp_path,
        "run",
        splits,
        "engine.minibatch=4",
        f"workflow={json.dumps({'graph': shell_loop(3), 'max_tokens': 128})}",
        "operators=[{name: topology, params: {max_evals: 4, search_tasks: 4, widen: null}}]",
        "budget.generations=1",
    )
    a, b = Archive(tmp_path / "plain"), Archive(tmp_path / "run")
    base = rep["baseline"]["system_id"]
    # the starting graph is the hand-written loop: the same commands, the same scores
    assert rep["baseline"]["val"] == plain["baseline"]["val"] and rep["baseline"]["val"]["score"] == 0.0
    assert {t.task_id: t.output["commands"] for t in b.trajectories(base, "val")} == {
        t.task_id: t.output["commands"] for t in a.trajectories(plain["baseline"]["system_id"], "val")
    }
    best = b.get_system(rep["best"]["system_id"])
    assert "harbor.review" in {n["type"] for n in best.workflow["graph"]["nodes"]}
    assert rep["best"]["test"]["score"] == 1.0 and rep["baseline"]["test"]["score"] == 0.0
    for t in b.trajectories(best.id, "test"):
        names = [s.name for s in t.steps if isinstance(s, ToolCall)]
        assert "node:review" in names and t.output["commands"][-1].startswith("echo ") and t.output["done"]

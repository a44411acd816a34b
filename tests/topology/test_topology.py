"""Workflow graphs that run: validation, execution order, conditions and bounds, failures,
votes, multi-role graphs, serialisation inside a System, pictures and the archive CLI."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli.archive import app
from evolve.llm.fake import ScriptedLM
from evolve.registry import node_types
from evolve.results.report import to_markdown
from evolve.rollout import run_agent
from evolve.topology import (
    Edge,
    Node,
    Workflow,
    WorkflowError,
    agent,
    calls_upper_bound,
    condition_holds,
    graph_of,
    validate,
)
from evolve.topology.edits import refs_of, shape_key
from evolve.topology.render import render_png, render_text
from evolve.types import LLMCall, ModelSpec, System, ToolCall

HERE = __name__  # import paths of the trusted functions below: f"{HERE}:name"


def double(x):
    return 2 * x


def needs_four(state):
    return "" if state.get("text") == "4" else f"{state.get('text')!r} is not 4"


class Ambiguous:  # a value whose comparison raises (as a numpy array's truth does)
    def __eq__(self, other):
        raise ValueError("the truth value is ambiguous")


def ambiguous():
    return Ambiguous()


def make_system(wf: Workflow, roles=("policy",), prompts=None) -> System:
    return System(
        workflow={"graph": wf.to_json()},
        prompts=prompts or {},
        models={r: ModelSpec(backend="scripted", name=r) for r in roles},
    )


def run(wf: Workflow, lms, task=None, roles=None, prompts=None, seed=0):
    lms = lms if isinstance(lms, dict) else {"policy": lms}
    system = make_system(wf, roles or tuple(lms), prompts)
    return run_agent(
        agent, system, task or {"id": "t1", "question": "2+2?", "x": 21}, lambda s, role: lms[role], seed=seed
    )


def node_order(traj) -> list[str]:
    return [s.name.split(":", 1)[1] for s in traj.steps if isinstance(s, ToolCall) and s.name.startswith("node:")]


def llm(nid, prompt="{question}", **kw) -> Node:
    max_visits = kw.pop("max_visits", None)
    return Node(id=nid, type="llm", params={"prompt": prompt, **kw}, max_visits=max_visits)


ANSWER = Node(id="answer", type="answer", params={"key": "text"})


# ----------------------------------------------------------------------------- validation


def test_validation_lists_each_problem():
    with pytest.raises(WorkflowError, match=r"dangling: its dst 'ansewr'.*did you mean 'answer'"):
        validate(Workflow(entry="a", nodes=(llm("a"), ANSWER), edges=(Edge(src="a", dst="ansewr"),)))
    with pytest.raises(WorkflowError, match=r"cycle .* has no bound; set max_visits"):
        validate(
            Workflow(
                entry="a",
                nodes=(llm("a"), llm("b"), ANSWER),
                edges=(Edge(src="a", dst="b"), Edge(src="b", dst="a", when="not text"), Edge(src="b", dst="answer")),
            )
        )
    with pytest.raises(WorkflowError, match=r"type 'lm', which does not exist; did you mean 'llm'"):
        validate(Workflow(entry="a", nodes=(Node(id="a", type="lm"),)))
    with pytest.raises(WorkflowError) as err:
        validate(
            Workflow(
                entry="v",
                nodes=(
                    Node(id="v", type="vote", params={"chain": ["a"], "n": 1, "key": "text"}),
                    Node(id="a", type="llm", params={"promt": "x"}),
                ),
            )
        )
    text = str(err.value)
    assert "node 'v' (vote): params.n" in text and "node 'a' (llm): params.prompt: Field required" in text
    assert "params.promt: Extra inputs are not permitted" in text
    with pytest.raises(WorkflowError, match="exactly one of expr"):
        validate(Workflow(entry="c", nodes=(Node(id="c", type="check", params={}),)))
    with pytest.raises(WorkflowError, match=r"node 'v' would run itself"):  # a vote in its own chain
        validate(Workflow(entry="v", nodes=(Node(id="v", type="vote", params={"chain": ["v"], "key": "text"}),)))
    votes = (
        Node(id="v", type="vote", params={"chain": ["w"], "key": "text"}),
        Node(id="w", type="vote", params={"chain": ["v"], "key": "text"}),
    )
    with pytest.raises(WorkflowError, match=r"run each other through their refs: (v -> w -> v|w -> v -> w)"):
        validate(Workflow(entry="v", nodes=votes))
    # bounded cycles are fine
    validate(
        Workflow(
            entry="a",
            nodes=(llm("a", max_visits=3), ANSWER),
            edges=(Edge(src="a", dst="a", when="not text"), Edge(src="a", dst="answer")),
        )
    )


def test_invalid_graph_fails_before_anything_runs_and_no_graph_is_a_clear_error():
    lm = ScriptedLM("p", ["x"])
    bad = Workflow(entry="a", nodes=(llm("a"), Node(id="b", type="nope")), edges=(Edge(src="a", dst="b"),))
    traj = run(bad, lm)
    assert "invalid workflow graph" in traj.error and "'nope'" in traj.error
    assert traj.steps == () and lm.calls == 0
    plain = System(models={"policy": ModelSpec(backend="scripted", name="p")})
    traj = run_agent(agent, plain, {"id": "t"}, lambda s, r: lm)
    assert "has no workflow graph" in traj.error


# ----------------------------------------------------------------------------- execution


def test_nodes_run_in_edge_order_and_record_steps():
    wf = Workflow(
        entry="twice",
        nodes=(
            Node(id="answer", type="answer", params={"fields": ["y", "text"]}),
            llm("ask", "double of {x} is {y}?"),
            Node(id="twice", type="tool", params={"fn": f"{HERE}:double", "args": {"x": "x"}, "out": "y"}),
        ),
        edges=(Edge(src="twice", dst="ask"), Edge(src="ask", dst="answer")),
    )
    traj = run(wf, ScriptedLM("p", ["yes"]))
    assert traj.ok, traj.error
    assert node_order(traj) == ["twice", "ask", "answer"]
    assert traj.output == {"y": 42, "text": "yes"}
    kinds = [(s.kind, getattr(s, "name", None)) for s in traj.steps]
    assert kinds == [
        ("tool", "double"),
        ("tool", "node:twice"),
        ("llm", None),
        ("tool", "node:ask"),
        ("tool", "node:answer"),
    ]
    step = traj.steps[1]
    assert step.args == {"type": "tool", "visit": 1} and step.result == {"y": 42} and step.duration >= 0
    assert traj.steps[0].args == {"x": 21} and traj.steps[0].result == 42
    assert traj.steps[2].messages[-1].content == "double of 21 is 42?"


def test_conditional_edges_and_max_visits_bound_a_loop():
    def wf(bound):
        return Workflow(
            entry="solve",
            nodes=(
                llm("solve", max_visits=bound),
                Node(id="check", type="check", params={"fn": f"{HERE}:needs_four"}),
                ANSWER,
            ),
            edges=(
                Edge(src="solve", dst="check"),
                Edge(src="check", dst="solve", when="not ok"),
                Edge(src="check", dst="answer"),
            ),
        )

    traj = run(wf(5), ScriptedLM("p", ["five", "six", "4", "never"]))
    assert node_order(traj) == ["solve", "check"] * 3 + ["answer"] and traj.output == "4"
    checks = [s.result for s in traj.steps if getattr(s, "name", "") == "node:check"]
    assert checks[0] == {"ok": False, "feedback": "'five' is not 4"} and checks[-1] == {"ok": True, "feedback": None}
    visits = [s.args["visit"] for s in traj.steps if getattr(s, "name", "") == "node:solve"]
    assert visits == [1, 2, 3]
    # the bound: after two tries the loop edge has no visits left, so the next edge (answer) is taken
    traj = run(wf(2), ScriptedLM("p", ["five"]))
    assert node_order(traj) == ["solve", "check", "solve", "check", "answer"] and traj.output == "five"


def test_max_steps_is_a_backstop():
    wf = Workflow(
        entry="a",
        max_steps=5,
        nodes=(llm("a", max_visits=50), ANSWER),
        edges=(Edge(src="a", dst="a", when="text != 'done'"), Edge(src="a", dst="answer")),
    )
    traj = run(wf, ScriptedLM("p", ["again"]))
    assert traj.ok and node_order(traj) == ["a"] * 5 and traj.output is None
    cut = traj.steps[-1]
    assert cut.name == "workflow:cut" and cut.args == {"max_steps": 5} and cut.result == {"next": "a"}
    assert calls_upper_bound(wf) == 5


def test_a_crashing_node_fails_the_trajectory_cleanly():
    wf = Workflow(
        entry="ask",
        nodes=(
            llm("ask"),
            Node(id="parse", type="tool", params={"fn": "json:loads", "args": {"s": "text"}}),
            ANSWER,
        ),
        edges=(Edge(src="ask", dst="parse"), Edge(src="parse", dst="answer")),
    )
    traj = run(wf, ScriptedLM("p", ["not json"]))
    assert not traj.ok
    assert traj.error.startswith("agent raised NodeError: node 'parse' (tool) raised JSONDecodeError")
    assert node_order(traj) == ["ask", "parse"]  # the earlier steps are kept; answer never ran
    assert isinstance(traj.steps[0], LLMCall) and traj.steps[0].output == "not json"
    tool, node = traj.steps[-2], traj.steps[-1]
    assert tool.name == "loads" and tool.error.startswith("JSONDecodeError")
    assert node.name == "node:parse" and node.error.startswith("JSONDecodeError") and node.result is None
    # with error_key the exception is data for the next edge instead
    caught = wf.replace_node(
        Node(id="parse", type="tool", params={"fn": "json:loads", "args": {"s": "text"}, "error_key": "error"})
    )
    traj = run(caught, ScriptedLM("p", ["not json"]))
    assert traj.ok and node_order(traj) == ["ask", "parse", "answer"]
    assert traj.steps[-2].result["error"].startswith("JSONDecodeError") and traj.steps[-2].result["result"] is None


def test_conditions_on_values_without_a_length_or_a_container_and_failures_name_the_edge():
    holds = condition_holds
    assert not holds("len(x) > 0", {"x": 5}) and not holds("len(x) != 1", {"x": 5}) and not holds("len(x)", {"x": 5})
    assert holds("not len(x)", {"x": 5}) and holds("len(x) == 0", {}) and holds("len(x) == 2", {"x": [1, 2]})
    assert not holds("1 in y", {}) and holds("1 not in y", {}) and holds("not (1 in y)", {})  # None holds nothing
    assert holds("1 not in y", {"y": [2]}) and not holds("1 not in y", {"y": [1]}) and not holds("1 not in y", {"y": 5})
    tool = Node(id="t", type="tool", params={"fn": f"{HERE}:double", "args": {"x": "x"}, "out": "y"})
    wf = Workflow(
        entry="t",
        nodes=(tool, llm("a", max_visits=1), ANSWER),  # y is 42: no length, that edge is not taken
        edges=(Edge(src="t", dst="a", when="len(y) > 0"), Edge(src="t", dst="answer")),
    )
    traj = run(wf, ScriptedLM("p", ["x"]))
    assert traj.ok and node_order(traj) == ["t", "answer"], traj.error
    odd = wf.replace_node(Node(id="t", type="tool", params={"fn": f"{HERE}:ambiguous", "out": "y"}))
    traj = run(
        odd.with_nodes(odd.nodes, [Edge(src="t", dst="a", when="y == 1"), Edge(src="t", dst="answer")]),
        ScriptedLM("p", ["x"]),
    )
    assert "NodeError: edge t -> a when y == 1: the condition raised ValueError: the truth" in traj.error


def test_a_missing_template_key_is_named():
    traj = run(Workflow(entry="a", nodes=(llm("a", "{question} {nope}"),)), ScriptedLM("p", ["x"]))
    assert "node 'a' (llm) raised KeyError" in traj.error and "{nope}" in traj.error and "'question'" in traj.error


def test_history_carries_the_conversation_and_prompt_components_fill_templates():
    wf = Workflow(
        entry="one",
        nodes=(
            llm("one", "{question}", history=True, system="sys"),
            llm("two", "{instruction} again", history=True, system="sys"),
            ANSWER,
        ),
        edges=(Edge(src="one", dst="two"), Edge(src="two", dst="answer")),
    )
    traj = run(wf, ScriptedLM("p", ["first", "second"]), prompts={"sys": "Be brief.", "instruction": "Check"})
    calls = [s for s in traj.steps if isinstance(s, LLMCall)]
    assert [(m.role, m.content) for m in calls[1].messages] == [
        ("system", "Be brief."),
        ("user", "2+2?"),
        ("assistant", "first"),
        ("user", "Check again"),
    ]
    assert traj.output == "second"


def test_reflect_sees_the_last_output_and_feedback_and_tools_take_constants():
    wf = Workflow(
        entry="solve",
        nodes=(
            llm("solve", "{question} {reflection}", max_visits=2),
            Node(id="check", type="check", params={"fn": f"{HERE}:needs_four"}),
            Node(id="reflect", type="reflect", params={"role": "critic"}),
            Node(id="twice", type="tool", params={"fn": f"{HERE}:double", "args": {"x": {"const": 5}}, "out": "ten"}),
            Node(id="answer", type="answer", params={"fields": ["text", "ten"]}),
        ),
        edges=(
            Edge(src="solve", dst="check"),
            Edge(src="check", dst="reflect", when="not ok"),
            Edge(src="reflect", dst="solve"),
            Edge(src="check", dst="twice"),
            Edge(src="twice", dst="answer"),
        ),
    )
    critic = ScriptedLM("c", lambda messages: "LESSON: add, do not spell")
    traj = run(
        wf,
        {"policy": ScriptedLM("p", ["four", "4"]), "critic": critic},
        task={"id": "t", "question": "2+2?", "reflection": ""},
    )
    assert traj.ok, traj.error
    assert node_order(traj) == ["solve", "check", "reflect", "solve", "check", "twice", "answer"]
    calls = [s for s in traj.steps if isinstance(s, LLMCall)]
    shown = calls[1].messages[-1].content
    assert calls[1].role == "critic" and "2+2?" in shown and "four" in shown and "'four' is not 4" in shown
    assert calls[2].messages[-1].content == "2+2? LESSON: add, do not spell"  # the reflection reaches the retry
    assert traj.output == {"text": "4", "ten": 10}


# ----------------------------------------------------------------------------- votes


def vote_graph(n=5, exclude=None, chain_check=False, key="text") -> Workflow:
    params = {"chain": ["sample", "judge"] if chain_check else ["sample"], "n": n, "key": key}
    if exclude:
        params["exclude_when"] = exclude
    nodes = [Node(id="vote", type="vote", params=params), llm("sample"), ANSWER]
    if chain_check:
        nodes.append(Node(id="judge", type="check", params={"expr": "text != 'bad'"}))
    return Workflow(entry="vote", nodes=tuple(nodes), edges=(Edge(src="vote", dst="answer"),))


@pytest.mark.parametrize(
    "replies, exclude, winner, votes",
    [
        (["b", "a", "a", "c", "a"], None, "a", 3),  # majority, though b came first
        (["z", "b", "z", "b", "c"], None, "z", 2),  # a 2-2 tie goes to the earliest sample
        (["bad", "bad", "bad", "x", "y"], "not ok", "x", 1),  # excluded samples do not vote
        (["bad", "bad", "bad", "bad", "bad"], "not ok", "bad", 5),  # unless all are excluded
    ],
)
def test_vote_majority_exclusion_and_ties(replies, exclude, winner, votes):
    traj = run(vote_graph(exclude=exclude, chain_check=True), ScriptedLM("p", replies))
    assert traj.ok, traj.error
    assert traj.output == winner
    node = next(s for s in traj.steps if getattr(s, "name", "") == "node:vote")
    assert node.result["votes"] == votes and node.result["samples"] == 5 and node.result["text"] == winner
    assert set(node.result) == {"text", "ok", "votes", "samples"}  # default keep: what the chain changed
    assert node_order(traj) == ["sample", "judge"] * 5 + ["vote", "answer"]


def test_vote_samples_at_its_temperature_with_different_seeds():
    seen = []

    def reply(messages, seed=None, temperature=None):
        seen.append((seed, temperature))
        return str(seed % 3)

    for seed in (0, 1):
        seen.clear()
        traj = run(vote_graph(n=7), ScriptedLM("p", reply), seed=seed)
        outs = [s.output for s in traj.steps if isinstance(s, LLMCall)]
        assert len(outs) == 7 and {t for _, t in seen} == {0.8} and len({s for s, _ in seen}) == 7
        counts = Counter(outs)
        expected = next(o for o in outs if counts[o] == max(counts.values()))
        assert traj.output == expected and len(set(outs)) > 1
    assert calls_upper_bound(vote_graph(n=7)) == 7


# ----------------------------------------------------------------------------- several agents


def test_solver_judge_graph_with_two_roles():
    judge_seen = []

    def judge(messages):
        judge_seen.append(messages)
        return "ACCEPT" if "42" in messages[-1].content else "REJECT"

    wf = Workflow(
        entry="solve",
        nodes=(
            llm("solve", "Solve: {question}", role="solver", out="solution"),
            llm(
                "judge",
                "Question: {question}\nProposed: {solution}\nACCEPT or REJECT?",
                role="judge",
                out="verdict",
                system="judge_rules",
            ),
            Node(id="answer", type="answer", params={"fields": ["solution", "verdict"]}),
        ),
        edges=(Edge(src="solve", dst="judge"), Edge(src="judge", dst="answer")),
    )
    traj = run(
        wf,
        {"solver": ScriptedLM("s", ["the answer is 42"]), "judge": ScriptedLM("j", judge)},
        prompts={"judge_rules": "You are a strict judge."},
    )
    assert traj.ok, traj.error
    assert traj.output == {"solution": "the answer is 42", "verdict": "ACCEPT"}
    calls = [s for s in traj.steps if isinstance(s, LLMCall)]
    assert [c.role for c in calls] == ["solver", "judge"]
    assert judge_seen[0][0].content == "You are a strict judge."
    assert "Proposed: the answer is 42" in judge_seen[0][-1].content


# ----------------------------------------------------------------------------- data, bounds, pictures


def test_graph_round_trips_inside_a_system_and_changes_its_id():
    wf = vote_graph(exclude="not ok", chain_check=True)
    system = make_system(wf)
    again = System.model_validate_json(system.model_dump_json())
    assert again == system and again.id == system.id and graph_of(again) == wf and graph_of(again).id == wf.id
    changed = make_system(
        wf.replace_node(Node(id="vote", type="vote", params={"chain": ["sample", "judge"], "n": 3, "key": "text"}))
    )
    assert changed.id != system.id and graph_of(changed) != wf
    assert graph_of(System()) is None
    copied = wf.model_copy(update={"entry": "sample"})  # pydantic's copy would keep the cached id
    assert copied.entry == "sample" and copied.id == Workflow.from_json(copied.to_json()).id != wf.id
    assert wf.model_copy().id == wf.id and wf.model_copy(deep=True) == wf
    renamed = Workflow.from_json(json.loads(json.dumps(wf.to_json()).replace('"sample"', '"s"')))
    vote = wf.node("vote")  # ids in a vote's chain count as ids: a renamed graph has its shape, a reordered chain not
    swapped = wf.replace_node(vote.model_copy(update={"params": {**vote.params, "chain": ["judge", "sample"]}}))
    keys = [shape_key(g, refs_of(g, node_types)) for g in (wf, renamed, swapped)]
    assert renamed.id != wf.id and keys[0] == keys[1] != keys[2]


def test_calls_upper_bound():
    loop = Workflow(
        entry="solve",
        nodes=(
            llm("plan"),
            llm("solve", max_visits=3),
            Node(id="check", type="check", params={"expr": "ok"}),
            ANSWER,
        ),
        edges=(
            Edge(src="solve", dst="check"),
            Edge(src="check", dst="solve", when="not ok"),
            Edge(src="check", dst="plan"),
            Edge(src="plan", dst="answer"),
        ),
    )
    assert calls_upper_bound(loop) == 3 + 3  # solve at most 3 times, plan once per check run
    assert calls_upper_bound(loop.with_nodes([*loop.nodes[:1], llm("solve"), *loop.nodes[2:]])) is None
    assert "at most 6" in render_text(loop)


def test_render_png_writes_an_image(tmp_path):
    wf = vote_graph(exclude="not ok", chain_check=True)
    path = render_png(wf, tmp_path / "sub" / "wf.png", title="vote")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_archive_show_prints_and_draws_the_graph(tmp_path):
    wf = vote_graph(exclude="not ok", chain_check=True)
    run_dir = tmp_path / "run"
    with Archive(run_dir) as a:
        with_graph = a.add_system(make_system(wf))
        plain = a.add_system(System(models={"policy": ModelSpec(backend="scripted", name="p")}))
        a.set_current(with_graph, "init")
    cli = CliRunner()
    png = tmp_path / "g.png"
    r = cli.invoke(app, ["show", str(run_dir), with_graph[:8], "--graph", str(png)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "workflow graph" in r.stdout and "[vote] vote" in r.stdout and "model calls per execution" in r.stdout
    assert png.read_bytes()[:4] == b"\x89PNG" and f"drawn to {png}" in r.stdout
    r = cli.invoke(app, ["show", str(run_dir), plain[:8]], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "workflow graph" not in r.stdout
    r = cli.invoke(app, ["show", str(run_dir), plain[:8], "--graph", str(tmp_path / "x.png")], env={"COLUMNS": "200"})
    assert r.exit_code == 2 and "no workflow graph" in r.output and not (tmp_path / "x.png").exists()


def test_report_markdown_includes_the_workflow():
    report = {
        "task": "t",
        "seed": 0,
        "baseline": None,
        "best": None,
        "generations": [],
        "workflow": {
            "system": "best",
            "system_id": "abcdef1234567890",
            "text": "workflow (entry a)",
            "image": "best_workflow.png",
        },
    }
    md = to_markdown(report)
    assert "## Workflow of the best system (`abcdef123456`)" in md and "workflow (entry a)" in md
    assert "![workflow graph](best_workflow.png)" in md


def test_engine_runs_a_graph_system_and_reports_its_workflow(tmp_path):
    import json

    import yaml

    import evolve
    from tests.helpers import DATA

    task = yaml.safe_load((DATA / "toy.yaml").read_text())
    graph = Workflow(
        entry="add", nodes=(llm("add", "{a} {b}", system="instruction"), ANSWER), edges=(Edge(src="add", dst="answer"),)
    )
    task.update(agent="evolve.topology:agent", workflow={"graph": graph.to_json()})
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(task))
    report = evolve.run(tmp_path / "task.yaml", out=tmp_path / "run")
    # as with the hand-written toy agent, evolving the instruction the llm node reads finds the exact one
    assert report["best"]["test"]["score"] == 1.0 and report["baseline"]["test"]["score"] < 0.2
    assert report["workflow"]["image"] == "best_workflow.png" and "[add] llm" in report["workflow"]["text"]
    assert (tmp_path / "run" / "best_workflow.png").read_bytes()[:4] == b"\x89PNG"
    assert "![workflow graph](best_workflow.png)" in (tmp_path / "run" / "report.md").read_text()
    assert json.loads((tmp_path / "run" / "report.json").read_text())["workflow"]["system"] == "best"

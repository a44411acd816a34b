"""Topology search: the edit grammar, MCTS on a synthetic problem with a known best graph,
cost-aware utility, AFlow's per-parent experience, evaluation caching, determinism, and the
``topology`` operator. Everything but the last test runs on pure evaluate functions and a fake
node type registry, so it does not depend on the runtime."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

import evolve.registry
from evolve.errors import UserError
from evolve.loop.operators import OperatorContext
from evolve.topology.edits import Edit, Palette, PaletteError, candidate_edits, enumerate_edits, normalize, shape_key
from evolve.topology.graph import Edge, Node, Workflow, WorkflowError, validate
from evolve.topology.operator import TopologySearch
from evolve.topology.search import MCTS, Experience, search, utility
from evolve.types import LLMCall, Message, Reward, System, Trajectory


class _P(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VoteP(_P):
    chain: list[str]
    n: int = 5
    temperature: float = 0.8
    key: str = "rows"
    exclude_when: str | None = None


CheckP = type("CheckP", (_P,), {"__annotations__": {"expr": str}})
StrictP = type("StrictP", (_P,), {"__annotations__": {"x": int}})  # required x: items without it give invalid graphs


class Kind:
    def __init__(self, params: type = _P, calls: bool = False, refs: bool = False) -> None:
        self.Params, self.calls_model = params, calls
        if refs:
            self.refs = lambda p: list(p.get("chain", []))


class FakeTypes(dict):  # what validate() needs of a registry: __contains__, get, names
    def names(self) -> list[str]:
        return sorted(self)


TYPES = FakeTypes(
    {
        "sql.write": Kind(calls=True),
        "sql.execute": Kind(),
        "sql.rewrite": Kind(calls=True),
        "vote": Kind(VoteP, refs=True),
        "check": Kind(CheckP),
        "reflect": Kind(calls=True),
        "answer": Kind(),
        "strict": Kind(StrictP),
    }
)
PALETTE = [
    {
        "name": "repair",
        "type": "sql.rewrite",
        "kind": "loop",
        "at": "sql.execute",
        "when": ["error", "error or empty"],
        "max_visits": [1, 2, 3],
    },
    {
        "name": "vote",
        "kind": "wrap",
        "chain_types": ["sql.write", "sql.execute"],
        "params": {"key": "rows", "exclude_when": "error"},
        "grid": {"n": [3, 5, 8], "temperature": [0.5, 0.8, 1.0]},
    },
    {"name": "check", "type": "check", "kind": "step", "params": {"expr": "rows"}},
    {"name": "reflect", "type": "reflect", "kind": "step"},
]
ROOT = Workflow(
    entry="write",
    nodes=(Node(id="write", type="sql.write"), Node(id="run", type="sql.execute"), Node(id="answer", type="answer")),
    edges=(Edge(src="write", dst="run"), Edge(src="run", dst="answer")),
)


def features(wf: Workflow) -> dict:
    f = {
        "loop": None,
        "when": None,
        "vote": None,
        "checks": len(wf.of_type("check")),
        "reflects": len(wf.of_type("reflect")),
    }
    for e in wf.edges:  # a repair loop: a conditional edge into a rewrite that goes back to an execute
        if (
            e.when
            and wf.node(e.dst).type == "sql.rewrite"
            and any(wf.node(o.dst).type == "sql.execute" for o in wf.out_edges(e.dst))
        ):
            f["loop"], f["when"] = wf.node(e.dst).max_visits, e.when
    for v in wf.of_type("vote"):
        if [wf.node(c).type for c in v.params["chain"]] == ["sql.write", "sql.execute"]:
            f["vote"] = (v.params["n"], v.params["temperature"])
    return f


def evaluate(wf: Workflow) -> tuple[float, float]:
    """Score and model calls per task as a pure function of graph features. The best utility
    (cost_weight 0.01): vote n=5 at temperature 0.8 over write/execute + repair loop x2 on error;
    n=8 scores 0.01 more but costs 3 more calls, max_visits 3 gains 0.003 for 0.5 calls."""
    f = features(wf)
    score, cost = 0.40, 1.0
    if f["loop"]:
        score += 0.10 + {1: 0.0, 2: 0.04, 3: 0.043}[f["loop"]] - (0.01 if f["when"] != "error" else 0.0)
        cost += 0.5 * f["loop"]
    if f["vote"]:
        n, t = f["vote"]
        score += {3: 0.10, 5: 0.15, 8: 0.16}[n] + {0.5: 0.0, 0.8: 0.02, 1.0: 0.01}[t]
        cost += n - 1
    score += -0.01 * f["checks"] + 0.004 * f["reflects"]
    return round(score, 6), cost + f["reflects"]


BEST = {"loop": 2, "when": "error", "vote": (5, 0.8), "checks": 0, "reflects": 0}


def by_kind(wf: Workflow) -> dict[str, list[tuple[Edit, Workflow]]]:
    out: dict[str, list] = {}
    for edit, new in enumerate_edits(wf, PALETTE, TYPES):
        out.setdefault(edit.kind, []).append((edit, new))
    return out


def apply(wf: Workflow, describe: str) -> Workflow:
    found = {e.describe(): new for e, new in enumerate_edits(wf, PALETTE, TYPES)}
    assert describe in found, (describe, sorted(found))
    return found[describe]


def test_palette_errors_name_the_item_and_the_fix():
    bad = [
        {"name": "repair", "kind": "loop", "type": "sql.rewrite"},  # no `at`
        {"name": "v", "kind": "wrap", "chain_types": ["a"], "params": {"n": 3}, "grid": {"n": [3, 5]}},
        {"name": "c", "kind": "step", "type": "check", "when": "error"},
        {"name": "x", "kind": "splice", "type": "check"},
        {"name": "l", "kind": "loop", "type": "t", "at": "a", "when": ["open('x')"]},
    ]
    with pytest.raises(PaletteError) as e:
        Palette.parse(bad)
    msg = str(e.value)
    for part in (
        "palette[0] (repair)",
        "needs at",
        "in both params and grid",
        "belong to loop items",
        "palette[3] (x)",
        "kind",
        "palette[4] (l)",
        "not allowed",
    ):
        assert part in msg, (part, msg)
    with pytest.raises(PaletteError, match="named 'a'"):
        Palette.parse(
            [{"name": "a", "kind": "step", "type": "check"}, {"name": "a", "kind": "step", "type": "reflect"}]
        )
    with pytest.raises(PaletteError, match="non-empty list"):
        Palette.parse([])
    pal = Palette.parse(PALETTE)
    assert pal.item("vote").type == "vote" and pal.item("repair").when == ["error", "error or empty"]
    pal.check(TYPES)  # fits the registry
    with pytest.raises(PaletteError, match=r"'nope' does not exist") as e:
        Palette.parse([*PALETTE, {"name": "z", "kind": "step", "type": "nope"}]).check(TYPES)
    with pytest.raises(PaletteError, match=r"params.*n"):
        Palette.parse([{**PALETTE[1], "grid": {"n": [3, "many"]}}]).check(TYPES)


def test_each_edit_kind_produces_the_expected_valid_graphs():
    kinds = by_kind(ROOT)
    assert set(kinds) == {"loop", "wrap", "step"}  # no set/rewire/remove targets in the root yet
    for pairs in kinds.values():
        for _, wf in pairs:
            validate(wf, TYPES)
    ((loop_edit, loop),) = kinds["loop"]
    assert loop_edit.describe() == "loop repair at run when error (x1)"
    assert [(e.src, e.dst, e.when) for e in loop.out_edges("run")] == [
        ("run", "repair", "error"),
        ("run", "answer", None),
    ]
    assert loop.node("repair").max_visits == 1 and loop.out_edges("repair")[0].dst == "run"
    ((_, wrapped),) = kinds["wrap"]
    vote = wrapped.node("vote")
    assert wrapped.entry == "vote" and vote.params == {
        "chain": ["write", "run"],
        "key": "rows",
        "exclude_when": "error",
        "n": 3,
        "temperature": 0.5,
    }
    assert [(e.src, e.dst) for e in wrapped.edges] == [("vote", "answer")]  # the vote runs the chain itself
    steps = {e.describe(): wf for e, wf in kinds["step"]}
    assert set(steps) == {
        f"insert {k} between {a} and {b}"
        for k in ("check", "reflect")
        for a, b in (("write", "run"), ("run", "answer"))
    }
    chk = steps["insert check between write and run"]
    assert [(e.src, e.dst) for e in chk.edges] == [("write", "check"), ("check", "run"), ("run", "answer")]

    after = by_kind(loop)  # the loop's node can now be tuned, rewired and removed
    assert {e.describe() for e, _ in after["set"]} == {"set repair.max_visits=2", "set repair.max_visits=3"}
    ((rw, rewired),) = after["rewire"]
    assert (
        rw.describe() == "rewire run -> repair when error or empty"
        and rewired.out_edges("run")[0].when == "error or empty"
    )
    removed = {e.describe(): wf for e, wf in after["remove"]}
    assert removed["remove repair"].id == normalize(ROOT).id  # the self-loop run -> run is dropped
    assert "insert check between write and run" in {e.describe() for e, _ in after["step"]}
    assert "loop" not in after  # one repair loop per node

    tuned = by_kind(wrapped)
    assert {e.describe() for e, _ in tuned["set"]} == {
        "set vote.n=5",
        "set vote.n=8",
        "set vote.temperature=0.8",
        "set vote.temperature=1.0",
    }
    ((unwrap, back),) = tuned["remove"]
    assert unwrap.describe() == "remove vote (unwrap its chain)" and back.id == normalize(ROOT).id


def test_wrap_and_loop_commute_and_unwrap_undoes_wrap():
    a = apply(apply(ROOT, "loop repair at run when error (x1)"), "wrap write -> run in vote")
    b = apply(apply(ROOT, "wrap write -> run in vote"), "loop repair at vote when error (x1)")
    assert a.id == b.id  # one graph, two edit paths: one node of the search tree
    assert [(e.src, e.dst, e.when) for e in a.out_edges("vote")] == [
        ("vote", "repair", "error"),
        ("vote", "answer", None),
    ]
    assert [(e.src, e.dst, e.when) for e in a.out_edges("run")] == [("run", "repair", "error"), ("run", "answer", None)]
    assert features(a) == {"loop": 1, "when": "error", "vote": (3, 0.5), "checks": 0, "reflects": 0}
    undone = apply(a, "remove vote (unwrap its chain)")
    assert undone.id == normalize(apply(ROOT, "loop repair at run when error (x1)")).id


def test_invalid_results_are_dropped():
    pal = [*PALETTE, {"name": "strict", "type": "strict", "kind": "step"}]  # params lack the required x
    raw = [e for e, _ in candidate_edits(ROOT, pal, TYPES)]
    assert any(e.item == "strict" for e in raw)
    got = enumerate_edits(ROOT, pal, TYPES)
    assert got and not any(e.item == "strict" for e, _ in got)
    for _, wf in got:
        validate(wf, TYPES)
    # a chained node cannot be removed (the vote would refer to nothing), even when any node may go
    wrapped = apply(ROOT, "wrap write -> run in vote")
    assert {e.targets for e, _ in enumerate_edits(wrapped, PALETTE, TYPES, remove="any") if e.kind == "remove"} == {
        ("vote",),
        ("answer",),
    }
    with pytest.raises(WorkflowError):
        validate(wrapped.with_nodes([n for n in wrapped.nodes if n.id != "run"]), TYPES)
    # max_nodes drops growth; results are distinct graphs
    assert not any(len(wf.nodes) > 3 for _, wf in enumerate_edits(ROOT, PALETTE, TYPES, max_nodes=3))
    ids = [wf.id for _, wf in enumerate_edits(apply(ROOT, "loop repair at run when error (x1)"), PALETTE, TYPES)]
    assert len(ids) == len(set(ids))


def test_one_graph_reached_by_two_edit_paths_is_one_node_and_one_evaluation():
    a = apply(apply(ROOT, "insert check between write and run"), "insert check between run and answer")
    b = apply(apply(ROOT, "insert check between run and answer"), "insert check between write and run")
    assert a.id != b.id and shape_key(a) == shape_key(b)  # check and check2 swapped: same graph
    ev, calls = counted(evaluate)
    result = search(ROOT, ev, [PALETTE[2]], TYPES, max_evals=10, widen=None)
    assert result.evaluations == len(calls) == 4 and result.transpositions > 0  # root, two one-check graphs, a


def counted(fn):
    calls: list[str] = []
    return (lambda wf: calls.append(wf.id) or fn(wf)), calls


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_mcts_finds_the_known_best_graph_within_bounded_evaluations(seed):
    ev, calls = counted(evaluate)
    result = search(ROOT, ev, PALETTE, TYPES, max_evals=40, seed=seed, cost_weight=0.01)
    assert features(result.best.wf) == BEST, [e.describe() for e in result.path(result.best.id)]
    assert result.evaluations == len(calls) <= 40
    assert len(calls) == len(set(calls)) and result.transpositions > 0  # graphs reached twice shared one node
    assert {e.kind for e in result.path(result.best.id)} >= {"loop", "wrap", "set"}  # the best is 5 edits deep
    assert result.best.utility == pytest.approx(0.71 - 0.01 * 5)


def test_cost_aware_utility_and_its_flip():
    assert utility(0.71, 3.0, 1.0, 0.01) == pytest.approx(0.69)  # 3x the cost: two points off
    assert utility(0.715, 3.0, 1.0, 0.01) < utility(0.70, 1.0, 1.0, 0.01)  # +1.5 points is not enough
    assert utility(0.725, 3.0, 1.0, 0.01) > utility(0.70, 1.0, 1.0, 0.01)
    assert utility(0.7, 3.0, 1.0, 0.01, "absolute") == pytest.approx(0.67)
    pal = [PALETTE[1]]  # only the vote: 1 + 9 graphs, all of them evaluated
    best_cheap = search(ROOT, evaluate, pal, TYPES, max_evals=20, cost_weight=0.01).best
    best_free = search(ROOT, evaluate, pal, TYPES, max_evals=20, cost_weight=0.0).best
    assert features(best_cheap.wf)["vote"] == (5, 0.8)  # n=8 is 0.01 better but 3 calls dearer
    assert features(best_free.wf)["vote"] == (8, 0.8)
    heavy = search(ROOT, evaluate, pal, TYPES, max_evals=20, cost_weight=0.2).best
    assert heavy.wf.id == normalize(ROOT).id  # at this price no vote is worth it
    absolute = search(ROOT, evaluate, pal, TYPES, max_evals=20, cost_weight=0.01, cost_mode="absolute").best
    assert features(absolute.wf)["vote"] == (5, 0.8)


def first_edit(experience: Experience | None, seed: int) -> Edit:
    result = search(ROOT, evaluate, PALETTE, TYPES, max_evals=2, seed=seed, experience=experience)
    return result.nodes[1].edit


def test_experience_changes_which_edit_is_tried():
    firsts = {first_edit(None, s).kind for s in range(6)}
    assert len(firsts) > 1  # without experience the order is the seeded rng's
    elsewhere = "0" * 16  # another parent's workflow id

    def helped(edit: Edit) -> Experience:
        exp = Experience()
        exp.record(elsewhere, edit, +0.05)  # this kind helped elsewhere: tried first from every parent
        exp.record(elsewhere, Edit("loop", "repair", ("x",)), -0.02)
        return exp

    for kind, edit in (("wrap", Edit("wrap", "vote", ("a", "b"))), ("step", Edit("step", "reflect", ("a", "b")))):
        assert {first_edit(helped(edit), s).kind for s in range(6)} == {kind}
    # the experience is live: what a search learns reorders the next one (reflect steps hurt here)
    shared = helped(Edit("step", "reflect", ("a", "b")))
    kinds = [first_edit(shared, s).kind for s in range(6)]
    assert kinds[0] == "step" and kinds[-1] == "wrap" and shared.prior(Edit("step", "check", ())) < 0
    # an edit that hurt from this parent is not tried again from it
    root_id = normalize(ROOT).id
    loop = next(e for e, _ in enumerate_edits(ROOT, PALETTE, TYPES) if e.kind == "loop")
    exp = Experience()
    exp.record(root_id, loop, -0.01)
    result = search(ROOT, evaluate, PALETTE, TYPES, max_evals=8, experience=exp)
    assert not any(n.parent == root_id and n.edit == loop for n in result.nodes)
    assert any(
        n.parent == root_id and n.edit == loop for n in search(ROOT, evaluate, PALETTE, TYPES, max_evals=8).nodes
    )
    # the search records what it tried, per parent, and the records round-trip through JSON
    rows = result.experience.records(root_id)
    assert rows and {r["outcome"] for r in rows} <= {"helped", "hurt"}
    again = Experience.from_json(json.loads(json.dumps(result.experience.to_json())))
    assert again.by_parent == result.experience.by_parent and again.prior(loop) == result.experience.prior(loop)


def test_evaluation_cache_is_shared_and_hits_cost_nothing():
    cache: dict = {}
    ev, calls = counted(evaluate)
    first = search(ROOT, ev, PALETTE, TYPES, max_evals=12, seed=0, cache=cache)
    assert len(calls) == first.evaluations == 12 == len(cache)
    second = MCTS(ev, PALETTE, TYPES, max_evals=12, seed=0, cache=cache)
    again = second.run(ROOT)
    # the same search again: its first 12 graphs come from the cache (free, not counted), then
    # it spends its 12 evaluations on new graphs; no graph is ever evaluated twice
    assert [n.id for n in again.nodes[:12]] == [n.id for n in first.nodes]
    assert second.cache_hits == 12 and again.evaluations == 12 and len(again.nodes) == 24
    assert len(calls) == len(set(calls)) == 24


def test_search_is_deterministic_given_the_seed():
    def trace(seed: int) -> list:
        r = search(ROOT, evaluate, PALETTE, TYPES, max_evals=25, seed=seed)
        return [(n.id, n.parent, n.visits, n.edit.describe() if n.edit else None) for n in r.nodes]

    assert trace(7) == trace(7)
    assert any(trace(7) != trace(s) for s in (8, 9, 10))


def _synthetic_rollouts(log: list):
    """ctx.rollouts over the synthetic problem: each trajectory carries the score as its reward
    and the model calls as LLMCall steps (integer calls: repair counts max_visits calls)."""
    from evolve.topology.graph import graph_of

    def rollouts(system, tasks, samples=1, temperature=None, tag="explore", logprobs=True):
        wf = graph_of(system)
        log.append((system.id, tag, len(tasks)))
        score, _ = evaluate(wf)
        f = features(wf)
        calls = (f["vote"][0] if f["vote"] else 1) + (f["loop"] or 0) + f["reflects"]
        step = LLMCall(role="policy", model="m", messages=(Message(role="user", content="q"),), output="a")
        return [
            Trajectory(task_id=str(t["id"]), system_id=system.id, steps=(step,) * calls, reward=Reward(score=score))
            for t in tasks
            for _ in range(samples)
        ]

    return rollouts


def _ctx(tmp_path, gen: int, name: str, rollouts) -> OperatorContext:
    (tmp_path / "work" / name).mkdir(parents=True)
    return OperatorContext(
        generation=gen,
        seed=0,
        rng=random.Random(gen),
        train=[{"id": f"t{i}", "q": f"q{i}"} for i in range(10)],
        trajectories=[],
        artifacts=None,
        workdir=tmp_path / "work" / name,
        rollouts=rollouts,
        log=lambda m: None,
    )


def test_operator_proposes_the_best_workflows_and_writes_its_report(tmp_path, monkeypatch):
    monkeypatch.setattr(evolve.registry, "node_types", TYPES)
    op = TopologySearch(palette=PALETTE, max_evals=40, search_tasks=4, children=2, cost_weight=0.01)
    est = {"rollouts": 160, "llm_calls": 0, "children": 2, "calls_per_rollout_max": 8 + 3 + 4}  # the root's call in a
    assert op.estimate(None) == est and op.calls_per_rollout_max(ROOT) == 15  # vote of 8, repair x3, reflect x(1+3)
    parent = System(workflow={"max_tokens": 96, "graph": ROOT.to_json()})
    log: list = []
    cands = op.propose(parent, _ctx(tmp_path, 0, "g0", _synthetic_rollouts(log)))
    assert len(cands) == 2 and all(t == "topology" and n == 4 for _, t, n in log) and len(log) <= 40
    assert log[0][0] == parent.id  # the root is the parent itself: its rollouts are shared
    best = Workflow.from_json(cands[0].system.workflow["graph"])
    assert features(best) == BEST and cands[0].system.workflow["max_tokens"] == 96
    assert cands[0].parents == (parent.id,) and cands[0].operator == "topology"
    assert cands[0].info["calls"] == 7 and cands[0].info["root_calls"] == 1
    assert cands[0].info["utility"] > cands[1].info["utility"] > cands[0].info["root_utility"]
    assert "wrap write -> run in vote" in cands[0].rationale and "set vote.n=5" in cands[0].rationale
    report = json.loads((tmp_path / "work" / "g0" / "topology.json").read_text())
    assert len(report["evaluated"]) == len(log) and sum(w["chosen"] for w in report["evaluated"]) == 2
    assert {"id", "signature", "score", "calls", "utility", "parent", "edit"} <= set(report["evaluated"][1])
    assert report["experience"]
    assert (tmp_path / "work" / "g0" / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the next generation starts from the experience this one wrote
    ctx1 = _ctx(tmp_path, 1, "g1", _synthetic_rollouts([]))
    assert len(op._experience(ctx1).events) == len(report["experience"])
    with pytest.raises(UserError, match="top-level `agent: evolve.topology:agent` and a `workflow.graph`"):
        op.propose(System(), ctx1)


def test_operator_params_are_checked():
    with pytest.raises(ValidationError, match=r"palette\[0\] \(r\): a loop item needs at"):
        TopologySearch(palette=[{"name": "r", "kind": "loop", "type": "sql.rewrite"}])
    op = TopologySearch(palette="evolve.worlds.sql.workflow:PALETTE")  # an import path to a list works too
    assert op.palette.item("repair").max_visits == [1, 2, 3]
    from evolve.worlds.sql.workflow import single_step, vote  # a vote of 16 and a repair loop x3, not stacked

    assert [op.calls_per_rollout_max(Workflow.from_json(g())) for g in (single_step, vote)] == [19, 19]


def test_operator_end_to_end_through_the_runtime(tmp_path):
    """Real node types and runtime, scripted LM: the model answers right only when sampled (a
    vote samples at its temperature), so the search must wrap the step in the cheapest vote."""
    from evolve.llm.fake import ScriptedLM
    from evolve.rollout import run_agent
    from evolve.topology import agent
    from evolve.types import ModelSpec

    lm = ScriptedLM(responses=lambda messages, temperature=None: "right" if temperature else "wrong")
    log: list = []

    def rollouts(system, tasks, samples=1, temperature=None, tag="explore", logprobs=True):
        log.append(system.id)
        trajs = [run_agent(agent, system, task, lambda s, role: lm, seed=i) for i, task in enumerate(tasks)]
        return [t.model_copy(update={"reward": Reward(score=float(t.output == "right"))}) for t in trajs]

    root = Workflow(
        entry="gen",
        nodes=(
            Node(id="gen", type="llm", params={"prompt": "{q}"}),
            Node(id="answer", type="answer", params={"key": "text"}),
        ),
        edges=(Edge(src="gen", dst="answer"),),
    )
    parent = System(workflow={"graph": root.to_json()}, models={"policy": ModelSpec(backend="scripted", name="s")})
    palette = [
        {"name": "vote", "kind": "wrap", "chain_types": ["llm"], "params": {"key": "text"}, "grid": {"n": [3, 5]}},
        {"name": "check", "type": "check", "kind": "step", "params": {"expr": "text"}},
    ]
    (cand,) = TopologySearch(palette=palette, max_evals=10, search_tasks=3).propose(
        parent, _ctx(tmp_path, 0, "g0", rollouts)
    )
    graph = Workflow.from_json(cand.system.workflow["graph"])
    (vote,) = graph.of_type("vote")
    assert graph.entry == vote.id and vote.params["chain"] == ["gen"] and vote.params["n"] == 3
    assert cand.info["score"] == 1.0 and cand.info["calls"] == 3.0
    assert cand.info["root_score"] == 0.0 and cand.info["root_calls"] == 1.0
    assert len(log) == len(set(log)) <= 10

"""DSPy interop: a DSPy program as the agent (its LM calls recorded as trajectory steps), its
instructions and demos as prompt components, DSPy optimisers as baselines on the same task file,
and the hosted example's plumbing against a local OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import pytest

from evolve.gateway import rollout_route as gateway
from evolve.gateway.local import serve_llm
from evolve.llm.fake import ScriptedLM
from evolve.prompts.dspy_interop import DSPyAgent, apply_components, components_from_program, dspy_agent, write_back
from evolve.prompts.dspy_interop import agent as generic_agent
from evolve.rollout import run_agent
from evolve.types import LLMCall, ModelSpec, System
from tests.helpers.dspy_fake import chat_reply, input_values

os.environ.setdefault("DSPY_CACHEDIR", tempfile.mkdtemp(prefix="dspy-cache-"))  # never the user's cache
dspy = pytest.importorskip("dspy")
pytest.importorskip("litellm")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "prompt_hosted"
ALONE = "the answer alone"  # the instruction phrase the scripted model obeys


@pytest.fixture(autouse=True, scope="module")
def _no_dspy_cache():
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)  # a cache hit would hide a call
    yield


# ----------------------------------------------------------------------------- programs and fakes


class TwoStep(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = dspy.Predict("question -> answer")
        self.check = dspy.ChainOfThought("question, draft -> answer")

    def forward(self, question):
        return self.check(question=question, draft=self.draft(question=question).answer)


def make_two_step() -> TwoStep:
    return TwoStep()


def make_qa():
    return dspy.Predict("question -> answer")


qa_agent = dspy_agent(make_qa, inputs=["question"], output="answer")


def _sum(question: str) -> str:
    a, b = map(int, re.findall(r"\d+", question)[:2])
    return str(a + b)


def scripted_fill(field, inputs, messages):
    """Right in the bare form only when told to answer alone or shown demos; chatty otherwise."""
    if field == "answer":
        q = inputs.get("question", "")
        value = EXAMPLE_ANSWERS.get(q) or _sum(q)
        return value if ALONE in messages[0].content or len(messages) > 2 else f"The answer is {value}."
    if field == "reasoning":
        return "Recall it."
    return f"Reply with {ALONE}."  # proposed instructions (MIPROv2), GEPA's reflection, descriptions


scripted_reply = chat_reply(scripted_fill)


def exact(task, output):
    return float(str(output).strip() == task["answer"])


def _example_answers() -> dict[str, str]:
    out = {}
    for split in ("train", "val", "test"):
        for line in (EXAMPLE / "data" / f"{split}.jsonl").read_text().splitlines():
            row = json.loads(line)
            out[row["question"]] = row["answer"]
    return out


EXAMPLE_ANSWERS = _example_answers()


def policy(**params) -> System:
    return System(models={"policy": ModelSpec(backend="scripted", name="fake", params=params)})


# ----------------------------------------------------------------------------- components and the agent


def test_components_from_a_two_predictor_program_change_what_the_lm_receives():
    prog = make_two_step()
    comps = components_from_program(prog)
    assert sorted(comps) == ["check.predict.demos", "check.predict.instruction", "draft.demos", "draft.instruction"]
    assert comps["draft.demos"] == "[]" and "produce the fields `answer`" in comps["draft.instruction"]
    new = {
        **comps,
        "draft.instruction": "DRAFT-MARKER: guess.",
        "check.predict.instruction": f"CHECK-MARKER: verify; give {ALONE}.",
        "draft.demos": json.dumps([{"question": "1 + 1?", "answer": "2", "id": "dropped"}]),
    }
    lm = ScriptedLM("fake", scripted_reply)
    seen = []
    lm_spy = ScriptedLM("spy", lambda msgs: (seen.append(msgs), lm.complete(msgs).text)[1])
    agent = DSPyAgent(prog, inputs=["question"], output="answer")
    traj = run_agent(agent, policy().replace(prompts=new), {"id": "t", "question": "2 + 3?"}, lambda s, r: lm_spy)
    assert traj.error is None and traj.output == "5"  # shown a demo, the scripted model answers alone
    draft, check = seen
    assert draft[0].content.endswith("DRAFT-MARKER: guess.") and "CHECK-MARKER" not in draft[0].content
    assert [m.role for m in draft] == ["system", "user", "assistant", "user"]  # the demo as a turn pair
    assert input_values(draft[1].content) == {"question": "1 + 1?"} and "[[ ## answer ## ]]\n2" in draft[2].content
    assert check[0].content.endswith(f"CHECK-MARKER: verify; give {ALONE}.") and len(check) == 2
    assert input_values(check[1].content) == {"question": "2 + 3?", "draft": "5"}
    # applied on a copy: the program itself is untouched; read back, the components round-trip (fields only)
    assert components_from_program(prog) == comps
    applied = components_from_program(apply_components(prog, new))
    assert applied == {**new, "draft.demos": json.dumps([{"question": "1 + 1?", "answer": "2"}])}
    # without its components the program answers chattily: the prompts made the difference
    plain = run_agent(agent, policy(), {"id": "t", "question": "2 + 3?"}, lambda s, r: lm)
    assert plain.output == "The answer is 5."


def test_bad_components_fail_loudly():
    prog = make_two_step()
    with pytest.raises(KeyError, match="names no predictor.*did you mean 'draft'"):
        apply_components(prog, {"draf.instruction": "x"})
    with pytest.raises(ValueError, match="not valid JSON"):
        apply_components(prog, {"draft.demos": "[{"})
    assert apply_components(prog, {"instruction": "not a predictor's component"}) is not prog  # ignored, copied
    traj = run_agent(
        qa_agent,
        policy().replace(prompts={"self.demos": "{}"}),
        {"id": "t", "question": "1 + 2?"},
        lambda s, r: ScriptedLM("fake", scripted_reply),
    )
    assert traj.error.startswith("agent raised ValueError") and "must be a JSON list" in traj.error


def test_a_dspy_program_as_agent_records_its_calls_with_token_ids():
    lm = ScriptedLM("fake", scripted_reply)
    system = policy(temperature=0.3, max_tokens=200).replace(prompts={"check.predict.instruction": f"Give {ALONE}."})
    traj = run_agent(
        dspy_agent(make_two_step, inputs={"question": "q"}, output="answer"),
        system,
        {"id": "t1", "q": "20 + 22?"},
        lambda s, r: lm,
        seed=3,
    )
    assert traj.error is None and traj.output == "42"
    assert len(traj.steps) == 2 and all(isinstance(s, LLMCall) for s in traj.steps)
    for step in traj.steps:
        assert step.role == "policy" and step.token_ids == tuple(step.output.encode())
        assert step.prompt_token_ids and step.temperature == 0.3  # DSPy sent none: the role's default
    assert "[[ ## draft ## ]]\nThe answer is 42." in traj.steps[1].messages[-1].content
    assert traj.tokens == sum(s.prompt_tokens + s.completion_tokens for s in traj.steps) > 0
    assert gateway.active() == 0  # the rollout's URL died with it
    explore = run_agent(
        dspy_agent(make_qa, inputs=["question"]),
        policy(temperature=0.3),
        {"id": "t", "question": "1 + 1?"},
        lambda s, r: lm,
        temperature=0.9,
    )
    assert explore.steps[0].temperature == 0.9 and explore.output == {"answer": "The answer is 2."}


def test_generic_agent_from_the_workflow_and_starting_prompts():
    workflow = {
        "dspy": {"program": "tests.prompts.test_dspy_interop:make_two_step", "inputs": ["question"], "output": "answer"}
    }
    assert generic_agent.initial_prompts(workflow) == components_from_program(make_two_step())
    system = policy().replace(workflow=workflow, prompts={"check.predict.instruction": f"Say {ALONE}."})
    traj = run_agent(
        generic_agent, system, {"id": "t", "question": "4 + 4?"}, lambda s, r: ScriptedLM("f", scripted_reply)
    )
    assert traj.error is None and traj.output == "8" and len(traj.steps) == 2
    bad = run_agent(
        generic_agent,
        policy().replace(workflow={"dspy": {"program": "x:y"}}),
        {"id": "t"},
        lambda s, r: ScriptedLM("f", scripted_reply),
    )
    assert "needs workflow.dspy.program" in bad.error
    typo = system.replace(workflow={"dspy": {**workflow["dspy"], "ouput": "answer"}})
    assert (
        "unknown setting(s) ['ouput']"
        in run_agent(
            generic_agent, typo, {"id": "t", "question": "1 + 1?"}, lambda s, r: ScriptedLM("f", scripted_reply)
        ).error
    )


def test_write_back_saves_a_program_carrying_the_evolved_components(tmp_path):
    evolved = {"draft.instruction": "Guess first.", "draft.demos": json.dumps([{"question": "q1", "answer": "a1"}])}
    prog = write_back(make_two_step(), policy().replace(prompts=evolved), tmp_path / "out" / "program.json")
    assert components_from_program(prog)["draft.instruction"] == "Guess first."
    fresh = make_two_step()
    fresh.load(str(tmp_path / "out" / "program.json"))
    assert components_from_program(fresh) == components_from_program(prog)
    assert dict(fresh.draft.demos[0]) == {"question": "q1", "answer": "a1"}  # DSPy loads demos as dicts


# ----------------------------------------------------------------------------- baselines


def test_plan_maps_a_budget_onto_each_optimiser():
    from evolve.prompts.baselines import plan

    assert plan("bootstrap", 10, n_predictors=2, n_train=50, n_val=20)["train"] == 5
    assert plan("bootstrap", 500, n_predictors=1, n_train=50, n_val=20)["train"] == 50
    g = plan("gepa", 70, n_predictors=1, n_train=50, n_val=40)
    assert g["max_metric_calls"] == 60 and g["val"] == 20 and g["estimated_llm_calls"] <= 70
    for budget in (40, 200, 1000):
        m = plan("mipro", budget, n_predictors=2, n_train=100, n_val=100)
        assert m["num_trials"] >= 1 and m["estimated_llm_calls"] <= budget + 2 * 35 * 2
    assert plan("gepa", None, n_predictors=1, n_train=5, n_val=5)["auto"] == "light"


def _tiny_task(tmp_path: Path, n=(6, 6, 6)) -> Path:
    rng = iter(range(1000))
    for split, k in zip(("train", "val", "test"), n):
        rows = []
        for i in range(k):
            a, b = next(rng), 7 * next(rng) % 50
            rows.append({"id": f"{split}{i}", "question": f"What is {a} + {b}?", "answer": str(a + b)})
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {
        "name": "tiny",
        "seed": 0,
        "agent": "tests.prompts.test_dspy_interop:qa_agent",
        "reward": "tests.prompts.test_dspy_interop:exact",
        "models": {
            "policy": {
                "backend": "scripted",
                "name": "fake",
                "params": {"reply": "tests.prompts.test_dspy_interop:scripted_reply", "temperature": 0.0},
            }
        },
        "dataset": {"train": "train.jsonl", "val": "val.jsonl", "test": "test.jsonl"},
        "operators": [{"name": "no_such_operator"}],  # ignored by baselines
        "runner": {"name": "thread", "workers": 4, "timeout": 60},
        "budget": {"generations": 1, "rollouts": 1},
    }
    path = tmp_path / "task.yaml"
    path.write_text(json.dumps(task))
    return path


def test_bootstrap_baseline_end_to_end_through_the_loopback_server(tmp_path):
    from evolve.archive import Archive
    from evolve.errors import RunDirError
    from evolve.prompts.baselines import run_dspy_baseline

    r = run_dspy_baseline(_tiny_task(tmp_path), "bootstrap", budget=5, out=tmp_path / "run")
    # the teacher sees 4 labeled demos, so it answers alone and its first 4 traces pass: 4 calls, then it stops
    assert r["knobs"]["train"] == 5 and r["spent"]["llm_calls"] == 4 and r["spent"]["metric_calls"] == 4
    assert r["spent"]["prompt_tokens"] > 0
    assert (r["split"], r["baseline"]["score"], r["compiled"]["score"], r["compiled"]["n"]) == ("test", 0.0, 1.0, 6)
    demos = json.loads(r["compiled"]["prompts"]["self.demos"])
    assert len(demos) == 4 and set(demos[0]) == {"question", "answer"}
    assert json.loads((tmp_path / "run" / "dspy_baseline.json").read_text()) == json.loads(json.dumps(r))
    assert (tmp_path / "run" / "program.json").exists()
    import evolve

    score, n, sid = evolve.evaluate(tmp_path / "task.yaml", tmp_path / "run", overrides=r["eval_overrides"])
    assert (score, n, sid) == (1.0, 6, r["compiled"]["system_id"])  # `evolve eval` on it: the same, memoised
    with Archive(tmp_path / "run", create=False) as archive:
        assert archive.current() == r["compiled"]["system_id"]
        assert archive.usage()["calls"] == 12  # 6 test rollouts each of the starting and the compiled program
        assert archive.record(r["compiled"]["system_id"]).operator == "dspy.bootstrap"
    with pytest.raises(RunDirError, match="already holds a finished DSPy baseline"):
        run_dspy_baseline(_tiny_task(tmp_path), "bootstrap", budget=5, out=tmp_path / "run")
    Archive(tmp_path / "other").close()  # e.g. an evolve run: never written into
    with pytest.raises(RunDirError, match="already holds another run"):
        run_dspy_baseline(_tiny_task(tmp_path), "bootstrap", budget=5, out=tmp_path / "other")


def broken_reply(messages):
    raise RuntimeError("the model is down")


def test_baseline_refuses_what_it_cannot_run(tmp_path):
    from evolve.errors import ConfigError, LLMError, UserError
    from evolve.prompts.baselines import run_dspy_baseline

    for _ in range(2):  # an unfinished baseline's run directory is taken up again
        with pytest.raises(LLMError, match="made 3 calls to the model and none succeeded.*the model is down"):
            run_dspy_baseline(
                _tiny_task(tmp_path),
                "bootstrap",
                budget=3,
                out=tmp_path / "r0",
                overrides=["models.policy.params.reply=tests.prompts.test_dspy_interop:broken_reply"],
            )
    with pytest.raises(UserError, match="at least 1 LLM call"):
        run_dspy_baseline(_tiny_task(tmp_path), "gepa", budget=0)

    with pytest.raises(UserError, match="did you mean 'mipro'"):
        run_dspy_baseline(_tiny_task(tmp_path), "mipo")
    with pytest.raises(ConfigError, match="is not a DSPy program"):
        run_dspy_baseline(
            _tiny_task(tmp_path), "bootstrap", out=tmp_path / "r2", overrides=["agent=evolve.worlds.toy:agent"]
        )


@pytest.mark.parametrize("optimizer", ["mipro", "gepa"])
def test_mipro_and_gepa_run_a_tiny_budget(tmp_path, optimizer):
    pytest.importorskip("optuna") if optimizer == "mipro" else pytest.importorskip("gepa")
    from evolve.prompts.baselines import run_dspy_baseline

    r = run_dspy_baseline(_tiny_task(tmp_path, (5, 4, 4)), optimizer, budget=30, out=tmp_path / "run")
    assert 0 < r["spent"]["llm_calls"] <= 33 and r["spent"]["metric_calls"] > 0  # within 10% of the budget
    # the scripted proposer / reflection suggests an instruction the scripted model obeys
    assert r["compiled"]["score"] == 1.0 and r["baseline"]["score"] == 0.0
    assert ALONE in r["compiled"]["prompts"]["self.instruction"] or json.loads(r["compiled"]["prompts"]["self.demos"])


# ----------------------------------------------------------------------------- the hosted example


@pytest.fixture
def local_openai(monkeypatch):
    lm = ScriptedLM("local", scripted_reply)
    server = serve_llm(lm, names=["gpt-4o-mini"])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield lm, f"models.policy.params.api_base={server.url}"
    server.close()
    sys.modules.pop("qa_program", None)


def _operators_written() -> bool:
    from evolve.registry import operators

    try:
        return all(operators.get(name) for name in ("reflective", "prompt_mutation"))
    except Exception:  # noqa: BLE001 - not written (or not importable) yet
        return False


def test_hosted_example_runs_end_to_end_against_a_local_server(tmp_path, local_openai):
    """The example's own task file, through litellm and HTTP, with its prompt operators (they ask the
    same scripted model, which proposes an instruction it then obeys); where those operators are not
    written yet, the scripted operator stands in for them."""
    import evolve
    from evolve.archive import Archive

    lm, api_base = local_openai
    own = _operators_written()
    ops = (
        []
        if own
        else [
            "operators=[{name: scripted, params: {component: solve.predict.instruction, "
            "choices: ['Reply with " + ALONE + ".']}}]"
        ]
    )
    report = evolve.run(
        EXAMPLE / "task.yaml",
        out=tmp_path / "run",
        overrides=[
            api_base,
            *ops,
            "budget.generations=1",
            "engine.minibatch=6",
            "engine.val_size=6",
            "engine.test_size=10",
            "runner.workers=4",
        ],
    )
    assert report["baseline"]["test"]["score"] == 0.0 and report["best"]["test"]["score"] == 1.0
    assert report["best"]["test"]["n"] == 10
    with Archive(tmp_path / "run", create=False) as archive:
        trajs = archive.trajectories()
        best = archive.get_system(report["best"]["system_id"])
        made_by = archive.record(best.id).operator
    assert best.prompts["solve.predict.instruction"] == f"Reply with {ALONE}."
    assert made_by in (("reflective", "prompt_mutation") if own else ("scripted",))
    steps = [s for t in trajs for s in t.steps]
    assert len(steps) == len(trajs) and lm.calls >= len(trajs)  # one ChainOfThought call per rollout
    assert all(isinstance(s, LLMCall) and s.model == "openai/gpt-4o-mini" for s in steps)


def _takes_starting_prompts() -> bool:
    root = Path(__file__).resolve().parents[2] / "evolve"
    return any(p.exists() and "initial_prompts" in p.read_text() for p in (root / "engine.py", root / "bootstrap.py"))


@pytest.mark.skipif(
    not _takes_starting_prompts(),
    reason="the engine does not yet take starting prompts from the agent's initial_prompts",
)
def test_engine_takes_starting_prompts_from_the_program(tmp_path, local_openai):
    import evolve
    from evolve.archive import Archive

    _, api_base = local_openai
    evolve.run(
        EXAMPLE / "task.yaml",
        out=tmp_path / "run",
        overrides=[api_base, "operators=[]", "budget.generations=0", "engine.val_size=2", "engine.test_size=2"],
    )
    with Archive(tmp_path / "run", create=False) as archive:
        prompts = archive.get_system("baseline").prompts
    assert sorted(prompts) == ["solve.predict.demos", "solve.predict.instruction"]
    assert prompts["solve.predict.instruction"] == "Answer the question."


def test_baseline_cli_on_the_hosted_example(tmp_path, local_openai):
    from typer.testing import CliRunner

    from evolve.prompts.cli import baseline_app

    _, api_base = local_openai
    t0 = time.monotonic()
    res = CliRunner().invoke(
        baseline_app,
        [
            "dspy",
            str(EXAMPLE / "task.yaml"),
            "--optimizer",
            "bootstrap",
            "--budget",
            "10",
            "--set",
            api_base,
            "--out",
            str(tmp_path / "b"),
        ],
    )
    assert res.exit_code == 0, res.output + repr(res.exception)
    r = json.loads((tmp_path / "b" / "dspy_baseline.json").read_text())
    assert r["model"] == {"backend": "litellm", "name": "openai/gpt-4o-mini"}
    assert r["budget"]["task_budget"]["usd"] == 1.0
    assert r["spent"]["llm_calls"] == 4 and (r["baseline"]["score"], r["compiled"]["score"]) == (0.0, 1.0)
    assert "4 LLM calls" in res.output and "0.0% (n=20) -> compiled 100.0% (n=20)" in res.output
    assert time.monotonic() - t0 < 60

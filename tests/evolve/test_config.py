"""Task-file validation: every user mistake is one clear message and exit code 2."""

import subprocess
import sys

import pytest
import yaml

from evolve.errors import ConfigError
from evolve.task.taskfile import load_task, validate_task
from tests.helpers import DATA

BASE = yaml.safe_load((DATA / "toy.yaml").read_text())


def _err(data, overrides=()):
    with pytest.raises(ConfigError) as e:
        validate_task(data, overrides, source="t.yaml")
    return str(e.value)


def test_valid_file_loads_with_defaults():
    cfg, base = load_task(DATA / "toy.yaml")
    assert cfg.name == "toy" and cfg.runner.workers == 4 and cfg.engine.val_tolerance == 0.0
    assert base == DATA.resolve()


def test_set_overrides_any_field():
    cfg = validate_task(
        BASE,
        ["budget.generations=1", "operators.0.params.children=2", "seed=7", "models.policy.params.temperature=0.5"],
    )
    assert cfg.budget.generations == 1 and cfg.operators[0].params["children"] == 2 and cfg.seed == 7
    assert cfg.models["policy"].params["temperature"] == 0.5


def test_unknown_key_names_path_and_suggests():
    msg = _err({**BASE, "budget": {"generatons": 2}})
    assert "t.yaml: budget.generatons: unknown field" in msg and "generations" in msg


def test_unknown_operator_param_names_path():
    data = {**BASE, "operators": [{"name": "scripted", "params": {"choices": ["a"], "componnet": "x"}}]}
    msg = _err(data)
    assert "operators.0.params.componnet" in msg and "component" in msg


def test_wrong_type():
    msg = _err({**BASE, "seed": "abc"})
    assert "seed" in msg and "abc" in msg


def test_unknown_operator_did_you_mean():
    msg = _err({**BASE, "operators": [{"name": "scriptd"}]})
    assert "operators.0.name" in msg and "did you mean 'scripted'" in msg


def test_unknown_backend_and_runner():
    assert "models.policy.backend" in _err(BASE, ["models.policy.backend=litelm"])
    assert "litellm" in _err(BASE, ["models.policy.backend=litelm"])
    assert "runner.name" in _err(BASE, ["runner.name=threads"])


def test_missing_required_and_cross_field():
    data = {k: v for k, v in BASE.items() if k != "agent"}
    assert "agent: required field is missing" in _err(data)
    msg = _err({**BASE, "dataset": {"source": "x:y", "train": "a.jsonl"}})
    assert "not both" in msg
    assert "cold_start" in _err(BASE, ["models.policy.backend=local"])


def test_pointer_options_with_the_char_tokenizer_are_refused_not_ignored():
    cold = [
        "models.policy.backend=local",
        "models.policy.params={}",
        "models.policy.cold_start.demos=evolve.worlds.sql:demos",
    ]
    ok = validate_task(BASE, cold + ["models.policy.cold_start.pointer_words=evolve.worlds.sql:name_words"])
    assert ok.models["policy"].cold_start.pointer_words == "evolve.worlds.sql:name_words"
    msg = _err(
        BASE,
        cold
        + [
            "models.policy.cold_start.tokenizer=char",
            "models.policy.cold_start.pointer_words=evolve.worlds.sql:name_words",
        ],
    )
    assert "models.policy.cold_start" in msg and "pointer_words applies only with tokenizer: pointer" in msg
    assert "keep_share" in _err(
        BASE, cold + ["models.policy.cold_start.tokenizer=char", "models.policy.cold_start.keep_share=0.1"]
    )
    assert validate_task(BASE, cold + ["models.policy.cold_start.tokenizer=char"]).models["policy"].cold_start


def test_workflow_graph_is_validated_at_load():
    graph = {
        "entry": "ask",
        "nodes": [
            {"id": "ask", "type": "lmm", "params": {"prompt": "{a}"}},
            {"id": "answer", "type": "answer", "params": {"key": "text"}},
        ],
        "edges": [{"src": "ask", "dst": "answer"}],
    }
    data = {**BASE, "agent": "evolve.topology:agent", "workflow": {"graph": graph}}
    msg = _err(data)  # a typo would fail every rollout, and the run would "succeed" with score 0
    assert "t.yaml: workflow.graph: invalid workflow graph" in msg and "did you mean 'llm'" in msg
    assert "workflow.graph" in _err(data, ["workflow.graph.entry=nowhere"])
    assert "workflow.graph: invalid workflow graph:\n  - nodes: Field required" in _err(
        data, ["workflow.graph={entry: a}"]
    )
    assert "workflow.graph: " in _err(data, ["workflow.graph=[1]"])
    graph["nodes"][0]["type"] = "llm"
    assert validate_task(data).workflow["graph"] == graph


def test_topology_palette_is_checked_at_load():
    def topology(palette):
        return {
            **BASE,
            "operators": [
                {"name": "scripted", "params": {"choices": ["a"]}},
                {"name": "topology", "params": {"palette": palette}},
            ],
        }

    assert "operators.1.params.palette" in _err(topology([{"name": "r", "kind": "loop"}]))  # malformed
    msg = _err(topology([{"name": "c", "kind": "step", "type": "chek", "params": {"expr": "ok"}}]))
    assert "t.yaml: operators.1.params.palette: " in msg and "'chek' does not exist" in msg  # no such node type
    msg = _err(
        topology(
            [{"name": "v", "kind": "wrap", "chain_types": ["llm"], "params": {"key": "text"}, "grid": {"n": [3, 64]}}]
        )
    )
    assert (
        "operators.1.params.palette" in msg
        and "v: params" in msg
        and "n: Input should be less than or equal to 32" in msg
    )
    validate_task(topology("evolve.worlds.sql.workflow:PALETTE"))  # an import path


def test_bad_set_syntax():
    assert "key.path=value" in _err(BASE, ["budget.generations"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_task(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_task(bad)


def _cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "evolve.cli.commands", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.update(reward="evolve.worlds.toy:rewrd"), "has no 'rewrd'"),
        (lambda d: d.update(agent="no_such_module:agent"), "cannot import module 'no_such_module'"),
        (lambda d: d.update(dataset={"train": "missing.jsonl", "val": "missing.jsonl"}), "does not exist"),
        (lambda d: d["budget"].update(generatons=1), "did you mean 'generations'"),
        (lambda d: d.update(operators=[{"name": "sar"}]), "unknown operator 'sar'"),
    ],
)
def test_cli_user_errors_exit_2_without_traceback(tmp_path, mutate, needle):
    data = yaml.safe_load((DATA / "toy.yaml").read_text())
    mutate(data)
    f = tmp_path / "task.yaml"
    f.write_text(yaml.safe_dump(data))
    r = _cli("run", str(f), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_unreadable_dataset(tmp_path):
    data = yaml.safe_load((DATA / "toy.yaml").read_text())
    (tmp_path / "train.jsonl").write_text('{"id": 1}\nnot json\n')
    data["dataset"] = {"train": "train.jsonl", "val": "train.jsonl"}
    f = tmp_path / "task.yaml"
    f.write_text(yaml.safe_dump(data))
    r = _cli("run", str(f), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2 and "train.jsonl:2: not valid JSON" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "lines, said",
    [
        (
            '{"a": 1}\n{"a": 2, "id": "train-1"}\n',
            "train.jsonl:2: task id 'train-1' (given there) is already the id of line 1 (assigned",
        ),
        ('{"a": 1, "id": "train-2"}\n{"a": 2}\n', "train.jsonl:2: task id 'train-2' (assigned"),
        (
            '{"id": "x"}\n{"id": "y"}\n{"id": "x"}\n',
            "train.jsonl:3: task id 'x' (given there) is already the id of line 1",
        ),
    ],
)
def test_a_jsonl_id_that_collides_is_named_with_its_file_and_line(tmp_path, lines, said):
    data = yaml.safe_load((DATA / "toy.yaml").read_text())
    (tmp_path / "train.jsonl").write_text(lines)
    (tmp_path / "val.jsonl").write_text('{"a": 1}\n')
    data["dataset"] = {"train": "train.jsonl", "val": "val.jsonl"}
    f = tmp_path / "task.yaml"
    f.write_text(yaml.safe_dump(data))
    r = _cli("run", str(f), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_init_scaffolds_a_valid_task(tmp_path):
    r = _cli("init", "t.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load((tmp_path / "t.yaml").read_text())
    cfg = validate_task(data)
    assert cfg.models["policy"].backend == "litellm"
    assert _cli("init", "t.yaml", cwd=tmp_path).returncode == 2

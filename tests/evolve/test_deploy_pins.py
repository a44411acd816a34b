"""The pins hold what the evaluation runs: the modules the reward and the agent import (by content,
or an installed package by its version), the files they read (opened on import, named in their
code, declared, or seen read while a gate scored), and the gate runs them from their sources."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import evolve
from evolve.archive import Archive
from evolve.deploy import DeployError
from evolve.deploy.manage import promote
from tests.evolve.test_deploy import _candidate, _jsonl

AGENT = '''
def agent(task, ctx):
    return "right" if task["x"] % 10 < int(ctx.system.prompts.get("skill", "5")) else "wrong"
'''
GRADING = '''
import deploy_tinypkg
from evolve.types import canonical_json  # noqa: F401 - the toolkit, pinned by its version


def grade(output):
    return deploy_tinypkg.ONE if output == "right" else 0.0
'''
REWARD = '''
import json
from pathlib import Path

from deploy_grading import grade

HERE = Path(__file__).parent
WEIGHT = json.loads((HERE / "deploy_weights.json").read_text())["right"]  # read on import


def reward(task, output):
    scale = json.loads((HERE / "deploy_table.json").read_text())["scale"]  # named here, read when scoring
    rules = HERE / ("deploy_" + "rules.json")  # a name only known when it runs
    if rules.exists():
        scale *= json.loads(rules.read_text())["scale"]
    return grade(output) * WEIGHT * scale
'''
MODULES = ("deploy_agent", "deploy_reward", "deploy_grading", "deploy_tinypkg")


def _package(site: Path, version: str) -> None:
    """An installed distribution deploy-tinypkg at ``version`` (its dist-info as pip leaves it)."""
    for old in site.glob("deploy_tinypkg-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    (site / "deploy_tinypkg").mkdir(exist_ok=True)
    (site / "deploy_tinypkg" / "__init__.py").write_text("ONE = 1.0\n")
    info = site / f"deploy_tinypkg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: deploy-tinypkg\nVersion: {version}\n")
    (info / "top_level.txt").write_text("deploy_tinypkg\n")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A task whose agent, reward, the reward's helper module, its data files and an installed
    package of its own are separate files; the run has started (and pinned the evaluation)."""
    site = tmp_path / "site"
    site.mkdir()
    _package(site, "1.0")
    monkeypatch.syspath_prepend(str(site))
    d = tmp_path / "task"
    d.mkdir()
    for name, text in (("deploy_agent.py", AGENT), ("deploy_grading.py", GRADING), ("deploy_reward.py", REWARD),
                       ("deploy_weights.json", '{"right": 1.0}'), ("deploy_table.json", '{"scale": 1.0}'),
                       ("deploy_notes.txt", "how the graders were briefed\n")):
        (d / name).write_text(text)
    rows = [{"id": f"n{i}", "x": i} for i in range(60)]
    task = {"name": "pins", "seed": 0, "agent": "deploy_agent:agent", "reward": "deploy_reward:reward",
            "models": {"policy": {"backend": "scripted", "name": "s"}}, "prompts": {"skill": "5"},
            "dataset": {"train": _jsonl(d / "train.jsonl", rows[:20]), "val": _jsonl(d / "val.jsonl", rows[20:])},
            "budget": {"generations": 0}, "runner": {"workers": 2},
            "deploy": {"regression": {"tasks": "val", "min_tasks": 30}, "data_files": ["deploy_notes.txt"]}}
    (d / "task.yaml").write_text(json.dumps(task))
    yield d, site
    for m in MODULES:
        sys.modules.pop(m, None)


def _start(d: Path) -> tuple[Path, str]:
    evolve.run(str(d / "task.yaml"), out=d / "run")
    with Archive(d / "run", create=False) as a:
        return d / "run", a.current()


@pytest.mark.parametrize("name, edit, whose", [
    ("deploy_grading.py", GRADING.replace('if output == "right" else 0.0', "or 1.0"), "module deploy_grading, run "
                                                                                      "by the reward"),
    ("deploy_agent.py", AGENT.replace('"5"', '"9"'), "module deploy_agent, run by the agent"),
    ("deploy_weights.json", '{"right": 2.0}', "read by the reward"),  # opened while the reward is imported
    ("deploy_table.json", '{"scale": 9.0}', "read by the reward"),  # named in the reward's code
    ("deploy_notes.txt", "anything goes\n", "read by the evaluation"),  # deploy.data_files
])
def test_a_change_to_what_the_evaluation_runs_is_refused_naming_the_file(project, name, edit, whose):
    d, _ = project
    run, base = _start(d)
    worse = _candidate(run, base, skill="3")
    (d / name).write_text(edit)
    for m in MODULES:
        sys.modules.pop(m, None)
    with pytest.raises(DeployError, match=rf"the evaluation changed since it was pinned: {d / name} changed "
                                          rf"\({whose}\).*--repin"):
        promote(d / "task.yaml", run, system=worse)
    with Archive(run, create=False) as a:
        assert a.current() == base


def test_an_upgraded_package_the_reward_imports_is_a_change(project):
    d, site = project
    run, base = _start(d)
    with Archive(run, create=False) as a:
        code = a.get_state("deploy.pins")["pins"]["code"]
    assert code["reward"]["packages"]["deploy-tinypkg"] == "1.0" and "deploy_tinypkg" not in code["reward"]["modules"]
    assert code["reward"]["packages"]["evolvekit"] == evolve.__version__  # the toolkit, by its version
    assert sorted(code["reward"]["modules"]) == ["deploy_grading", "deploy_reward"]
    _package(site, "1.1")
    with pytest.raises(DeployError, match=r"the reward's package deploy-tinypkg: 1.0 -> 1.1"):
        promote(d / "task.yaml", run, system=_candidate(run, base, skill="8"))


def test_a_forged_bytecode_cache_of_the_reward_is_refused_and_never_runs(project):
    """A .pyc beside the reward whose header matches the source (so Python would load it) but whose
    code scores every answer 1."""
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    from evolve.deploy.pins import from_source
    from evolve.registry import import_path

    d, _ = project
    run, base = _start(d)
    worse = _candidate(run, base, skill="3")
    src = d / "deploy_reward.py"
    forged = compile("def reward(task, output):\n    return 1.0\n", str(src), "exec")
    cache = Path(importlib.util.cache_from_source(str(src)))
    cache.parent.mkdir(exist_ok=True)
    st = src.stat()
    cache.write_bytes(_code_to_timestamp_pyc(forged, st.st_mtime, st.st_size))
    sys.modules.pop("deploy_reward", None)
    assert import_path("deploy_reward:reward", search=d)({}, "wrong") == 1.0  # what Python itself would run
    with pytest.raises(DeployError, match=rf"{cache} \(module deploy_reward\) is not what {src} compiles to.*delete"):
        promote(d / "task.yaml", run, system=worse)
    with Archive(run, create=False) as a:
        pins = a.get_state("deploy.pins")["pins"]
    with from_source(pins):  # what a gate runs
        assert import_path("deploy_reward:reward", search=d)({}, "wrong") == 0.0
    cache.unlink()
    assert promote(d / "task.yaml", run, system=worse)["state"] == "rejected"


def test_a_file_a_gate_is_seen_reading_is_pinned_from_then_on(project):
    d, _ = project
    (d / "deploy_rules.json").write_text('{"scale": 1.0}')
    run, base = _start(d)
    good = _candidate(run, base, skill="8")
    with pytest.raises(DeployError, match=rf"the evaluation read {d / 'deploy_rules.json'}, which the pins did not "
                                          r"hold; nothing was decided\. They are pinned now"):
        promote(d / "task.yaml", run, system=good)
    assert promote(d / "task.yaml", run, system=good)["state"] == "active"
    (d / "deploy_rules.json").write_text('{"scale": 0.0}')
    with pytest.raises(DeployError, match=rf"{d / 'deploy_rules.json'} changed \(read by the evaluation\)"):
        promote(d / "task.yaml", run, system=_candidate(run, good, skill="9"))

"""The pins hold what the evaluation runs: the modules the reward and the agent import (by content,
or an installed package by its version), the files they read (opened on import, named in their
code, declared, or accepted by a person after a gate read them), and the gate runs them from their
sources. A package installed in place (pip install -e) is pinned by content, as the task's own code."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

import evolve
from evolve.archive import Archive
from evolve.deploy import DeployError
from evolve.deploy.manage import promote, status
from tests.evolve.test_deploy import _candidate, _jsonl

AGENT = """
def agent(task, ctx):
    return "right" if task["x"] % 10 < int(ctx.system.prompts.get("skill", "5")) else "wrong"
"""
GRADING = """
import deploy_tinypkg
from evolve.types import canonical_json  # noqa: F401 - the toolkit, pinned by its version


def grade(output):
    return deploy_tinypkg.ONE if output == "right" else 0.0
"""
REWARD = """
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
"""
MODULES = ("deploy_agent", "deploy_reward", "deploy_grading", "deploy_tinypkg", "deploy_editpkg")


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
    for name, text in (
        ("deploy_agent.py", AGENT),
        ("deploy_grading.py", GRADING),
        ("deploy_reward.py", REWARD),
        ("deploy_weights.json", '{"right": 1.0}'),
        ("deploy_table.json", '{"scale": 1.0}'),
        ("deploy_notes.txt", "how the graders were briefed\n"),
    ):
        (d / name).write_text(text)
    rows = [{"id": f"n{i}", "x": i} for i in range(60)]
    task = {
        "name": "pins",
        "seed": 0,
        "agent": "deploy_agent:agent",
        "reward": "deploy_reward:reward",
        "models": {"policy": {"backend": "scripted", "name": "s"}},
        "prompts": {"skill": "5"},
        "dataset": {"train": _jsonl(d / "train.jsonl", rows[:20]), "val": _jsonl(d / "val.jsonl", rows[20:])},
        "budget": {"generations": 0},
        "runner": {"workers": 2},
        "deploy": {"regression": {"tasks": "val", "min_tasks": 30}, "data_files": ["deploy_notes.txt"]},
    }
    (d / "task.yaml").write_text(json.dumps(task))
    yield d, site
    for m in MODULES:
        sys.modules.pop(m, None)


def _start(d: Path) -> tuple[Path, str]:
    evolve.run(str(d / "task.yaml"), out=d / "run")
    with Archive(d / "run", create=False) as a:
        return d / "run", a.current()


@pytest.mark.parametrize(
    "name, edit, whose",
    [
        (
            "deploy_grading.py",
            GRADING.replace('if output == "right" else 0.0', "or 1.0"),
            "module deploy_grading, run by the reward",
        ),
        ("deploy_agent.py", AGENT.replace('"5"', '"9"'), "module deploy_agent, run by the agent"),
        ("deploy_weights.json", '{"right": 2.0}', "read by the reward"),  # opened while the reward is imported
        ("deploy_table.json", '{"scale": 9.0}', "read by the reward"),  # named in the reward's code
        ("deploy_notes.txt", "anything goes\n", "read by the evaluation"),  # deploy.data_files
    ],
)
def test_a_change_to_what_the_evaluation_runs_is_refused_naming_the_file(project, name, edit, whose):
    d, _ = project
    run, base = _start(d)
    worse = _candidate(run, base, skill="3")
    (d / name).write_text(edit)
    for m in MODULES:
        sys.modules.pop(m, None)
    with pytest.raises(
        DeployError,
        match=rf"the evaluation changed since it was pinned: {d / name} changed "
        rf"\({whose}\).*--repin",
    ):
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


def _gate_rollouts(run: Path) -> int:
    with Archive(run, create=False) as a, a._read() as c:
        return c.execute("SELECT COUNT(*) FROM trajectories WHERE phase = 'gate'").fetchone()[0]


def test_a_file_a_gate_reads_refuses_until_a_person_accepts_it_by_a_command_that_shows_it(project):
    from typer.testing import CliRunner

    from evolve.cli.commands import app

    d, _ = project
    rules = d / "deploy_rules.json"
    rules.write_text('{"scale": 1.0}')
    sha = hashlib.sha256(rules.read_bytes()).hexdigest()
    run, base = _start(d)
    good = _candidate(run, base, skill="8")
    with pytest.raises(
        DeployError,
        match=rf"the evaluation read {rules} \(sha256 {sha}\), which the pins do not "
        rf"hold; nothing was decided\..*--accept-read {rules}",
    ):
        promote(d / "task.yaml", run, system=good)
    scored = _gate_rollouts(run)
    for _ in range(2):  # never pinned on the second try: refused again, before anything is scored
        with pytest.raises(
            DeployError,
            match=rf"the evaluation reads files no one has accepted yet: {rules} "
            rf"\(sha256 {sha}\)",
        ):
            promote(d / "task.yaml", run, system=good)
    assert _gate_rollouts(run) == scored
    assert status(run)["unaccepted"] == {str(rules): sha}  # evolve status says what waits for a person
    shown = CliRunner().invoke(app, ["status", str(run)], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert f"waiting for a person: the evaluation read {rules} (sha256 {sha})" in shown.output, shown.output
    with pytest.raises(DeployError, match="no one has accepted"):  # a re-pin does not accept it either
        promote(d / "task.yaml", run, system=good, repin=True)
    res = CliRunner().invoke(
        app,
        ["promote", str(d / "task.yaml"), str(run), "--accept-read", str(rules), "--by", "ana"],
        env={"COLUMNS": "400", "NO_COLOR": "1"},
    )
    assert res.exit_code == 0, res.output
    assert f"{rules}\n  sha256 {sha}, 14 bytes" in res.output and '{"scale": 1.0}' in res.output
    assert "accepted by ana and pinned as they are now" in res.output
    assert status(run)["unaccepted"] == {}
    assert promote(d / "task.yaml", run, system=good)["state"] == "active"
    rules.write_text('{"scale": 0.0}')
    with pytest.raises(DeployError, match=rf"{rules} changed \(read by the evaluation\)"):
        promote(d / "task.yaml", run, system=_candidate(run, good, skill="9"))


def test_accepting_a_file_is_refused_when_anything_else_changed_and_a_missing_file_is_named(project):
    from evolve.deploy import accept_reads

    d, _ = project
    (d / "deploy_rules.json").write_text('{"scale": 1.0}')
    run, base = _start(d)
    with pytest.raises(DeployError, match="read .*deploy_rules.json"):
        promote(d / "task.yaml", run, system=_candidate(run, base, skill="8"))
    with pytest.raises(
        evolve.errors.UserError,
        match=rf"--accept-read nope.json: .*nope.json is not a file; name a "
        rf"file the refusal listed \({d / 'deploy_rules.json'}\)",
    ):
        accept_reads(d / "task.yaml", run, ["nope.json"])
    (d / "deploy_weights.json").write_text('{"right": 5.0}')
    with pytest.raises(
        DeployError,
        match=r"changed since it was pinned, besides the files to accept: .*"
        r"deploy_weights.json changed.*--repin",
    ):
        accept_reads(d / "task.yaml", run, [d / "deploy_rules.json"])


def _editable(site: Path, src: Path, body: str, *, marked: bool = True) -> None:
    """deploy-editpkg installed with pip install -e: its metadata in ``site``, its code left in ``src``."""
    (src / "deploy_editpkg").mkdir(parents=True, exist_ok=True)
    (src / "deploy_editpkg" / "__init__.py").write_text(body)
    info = site / "deploy_editpkg-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deploy-editpkg\nVersion: 0.1\n")
    (info / "top_level.txt").write_text("deploy_editpkg\n")
    if marked:
        (info / "direct_url.json").write_text(json.dumps({"url": src.as_uri(), "dir_info": {"editable": True}}))


@pytest.mark.parametrize("marked", [True, False])
def test_a_reward_package_installed_in_place_is_pinned_by_content(project, monkeypatch, marked):
    d, site = project
    src = d.parent / "elsewhere"
    _editable(site, src, "def ONE():\n    return 1.0\n", marked=marked)
    monkeypatch.syspath_prepend(str(src))  # what the .pth of an editable install does
    (d / "deploy_grading.py").write_text(
        GRADING.replace("import deploy_tinypkg", "import deploy_tinypkg\nimport deploy_editpkg").replace(
            "deploy_tinypkg.ONE if", "deploy_tinypkg.ONE * deploy_editpkg.ONE() if"
        )
    )
    run, base = _start(d)
    with Archive(run, create=False) as a:
        code = a.get_state("deploy.pins")["pins"]["code"]
    init = src / "deploy_editpkg" / "__init__.py"
    assert code["reward"]["modules"]["deploy_editpkg"]["file"] == str(init.resolve())
    assert "deploy-editpkg" not in code["reward"]["packages"]
    init.write_text("def ONE():\n    return 1.0 if False else 9.0\n")  # its logic edited, its version the same
    sys.modules.pop("deploy_editpkg", None)
    with pytest.raises(DeployError, match=rf"{init.resolve()} changed \(module deploy_editpkg, run by the reward\)"):
        promote(d / "task.yaml", run, system=_candidate(run, base, skill="3"))


PIP_E = """
import json, sys
from pathlib import Path
import evolve
from evolve.archive import Archive
from evolve.deploy import DeployError
from evolve.deploy.manage import promote, status

d = Path(sys.argv[1])
evolve.run(str(d / "task.yaml"), out=d / "run")
with Archive(d / "run", create=False) as a:
    base = a.get_system(a.current())
    code = a.get_state("deploy.pins")["pins"]["code"]["reward"]
    cand = base.replace(prompts={"skill": "3"})
    a.add_system(cand, parents=(base.id,), operator="test", rationale="worse", generation=1)
init = Path(sys.argv[2])
init.write_text(init.read_text().replace("return 1.0", "return 9.0"))  # its logic edited, its version the same
try:
    out = promote(d / "task.yaml", d / "run", system=cand.id)["state"]
except DeployError as e:
    out = str(e)
print(json.dumps({"modules": sorted(code["modules"]), "packages": code["packages"], "promote": out}))
"""


def test_a_reward_package_installed_with_pip_install_e_is_pinned_by_content(tmp_path):
    """A real ``pip install -e`` (setuptools' editable finder) into a fresh environment that sees this one."""
    import subprocess
    import sysconfig

    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    (src / "deploy_pipe").mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
        '"setuptools.build_meta"\n[project]\nname = "deploy-pipe"\nversion = "0.1"\n'
    )
    (src / "deploy_pipe" / "__init__.py").write_text("def one():\n    return 1.0\n")
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    here = sysconfig.get_paths()["purelib"]
    there = Path(
        subprocess.run(
            [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (there / "zz_evolvekit.pth").write_text(f"import site; site.addsitedir({here!r})\n")  # this environment's packages
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "--prefix",
            str(env),
            "-e",
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        pytest.skip(f"pip install -e cannot build offline here: {pip.stderr.strip()[-300:]}")
    d = tmp_path / "task"
    d.mkdir()
    (d / "deploy_agent.py").write_text(AGENT)
    (d / "deploy_reward.py").write_text(
        "import deploy_pipe\n\n\ndef reward(task, output):\n"
        "    return deploy_pipe.one() if output == 'right' else 0.0\n"
    )
    rows = [{"id": f"n{i}", "x": i} for i in range(60)]
    (d / "task.yaml").write_text(
        json.dumps(
            {
                "name": "pipe",
                "seed": 0,
                "agent": "deploy_agent:agent",
                "reward": "deploy_reward:reward",
                "models": {"policy": {"backend": "scripted", "name": "s"}},
                "prompts": {"skill": "5"},
                "dataset": {"train": _jsonl(d / "train.jsonl", rows[:20]), "val": _jsonl(d / "val.jsonl", rows[20:])},
                "budget": {"generations": 0},
                "deploy": {"regression": {"tasks": "val", "min_tasks": 30}},
            }
        )
    )
    init = (src / "deploy_pipe" / "__init__.py").resolve()
    r = subprocess.run(
        [str(env / "bin" / "python"), "-c", PIP_E, str(d), str(init)], capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert "deploy_pipe" in got["modules"] and "deploy-pipe" not in got["packages"]
    assert got["promote"].startswith(
        f"the evaluation changed since it was pinned: {init} changed (module deploy_pipe, run by the reward)"
    ), got["promote"]

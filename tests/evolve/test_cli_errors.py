"""The CLI never shows a traceback for a user's mistake; a failed start leaves nothing in the way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import stored_rollouts

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parents[1] / "data"


def cli(*args, cwd, timeout=300, **kw):
    return subprocess.run(
        [sys.executable, "-m", "evolve", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw
    )


def test_every_entry_point_given_bad_input_answers_without_a_traceback():
    from tests.helpers import cli_bad_input

    rows = cli_bad_input.check(inproc=True, verbose=False)
    tracebacks = [" ".join(c.args) + "\n" + text for c, _, tb, text in rows if tb]
    assert not tracebacks, tracebacks[0]
    wrong = [(" ".join(c.args), code, c.code, text[-300:]) for c, code, _, text in rows if code != c.code]
    assert not wrong, wrong
    assert len(rows) >= 70


def test_version_help_python_m_and_completion(tmp_path):
    from evolve import __version__

    r = cli("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"evolvekit {__version__}"
    r = cli("-h", cwd=tmp_path)
    assert r.returncode == 0 and "run" in r.stdout and "Traceback" not in r.stderr
    r = cli(cwd=tmp_path)  # bare: the help, as a usage error
    assert r.returncode == 2 and "Usage" in r.stdout + r.stderr and "Traceback" not in r.stderr
    env = {**os.environ, "_EVOLVE_COMPLETE": "complete_bash", "COMP_WORDS": "evolve ru", "COMP_CWORD": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "evolve"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 0 and r.stdout.split() == ["run"]


def _toy(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((DATA / "toy.yaml").read_text())
    data.update(changes)
    f = tmp_path / "task.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_ctrl_c_exits_130_and_prints_the_command_that_resumes(tmp_path):
    task = _toy(tmp_path)
    out = tmp_path / "run"
    sets = ["--set", "models.policy.params.delay=0.2", "--set", "budget.generations=1"]  # seconds, not a blink
    p = subprocess.Popen(
        [sys.executable, "-m", "evolve", "run", str(task), "--out", str(out), *sets],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a terminal's foreground job: Ctrl-C is delivered, whatever an earlier test left ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 60
    while time.time() < deadline and not stored_rollouts(out):  # interrupted once some work is done
        time.sleep(0.05)
    assert p.poll() is None, "the run finished before it could be interrupted"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "Continue with:" in err
    command = err.split("Continue with:")[1].strip().splitlines()[0]
    assert f"--out {out}" in command and "--resume" in command and "models.policy.params.delay=0.2" in command
    words = command.split()
    assert words[:2] == ["evolve", "run"]
    r = cli(*words[1:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_the_templates_own_check_with_its_data_missing_leaves_no_run_directory(tmp_path):
    assert cli("init", "task.yaml", cwd=tmp_path).returncode == 0
    r = cli("run", "task.yaml", "--set", "budget.generations=0", cwd=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_missing_memory_store_is_found_before_the_run_directory_is_made(tmp_path):
    task = _toy(tmp_path, memory={"store": "no_store_here"})
    r = cli("run", str(task), "--out", "run", cwd=tmp_path)
    assert r.returncode == 2 and "memory.store: no memory store" in r.stderr and not (tmp_path / "run").exists()


def test_a_start_that_failed_after_the_archive_was_made_is_replaced_by_the_next(tmp_path):
    (tmp_path / "hooked.py").write_text(
        "from evolve.errors import UserError\nfrom evolve.worlds.toy import agent as _agent\n\n"
        "def agent(task, ctx):\n    return _agent(task, ctx)\n\n"
        "def _prompts(workflow, base_dir):\n    raise UserError('the program file is broken')\n\n"
        "agent.initial_prompts = _prompts\n"
    )
    task = _toy(tmp_path, agent="hooked:agent", prompts={})
    r = cli("run", str(task), "--out", "run", cwd=tmp_path)
    assert r.returncode == 2 and "the program file is broken" in r.stderr and (tmp_path / "run").exists()
    task = _toy(tmp_path)  # fixed: another task; the run directory holds no work, so it is replaced
    r = cli("run", str(task), "--out", "run", "--set", "budget.generations=0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_a_changed_task_file_says_what_changed_and_fresh_starts_over_without_deleting(tmp_path):
    task = _toy(tmp_path, budget={"generations": 0})
    assert cli("run", str(task), "--out", "run", cwd=tmp_path).returncode == 0
    task = _toy(tmp_path, budget={"generations": 0}, seed=5, engine={"minibatch": 8})
    r = cli("run", str(task), "--out", "run", "--resume", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "seed: 0 -> 5" in r.stderr and "engine.minibatch: 12 -> 8" in r.stderr and "--fresh" in r.stderr
    r = cli("run", str(task), "--out", "run", "--fresh", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(aside) == 1 and (aside[0] / "archive.sqlite").exists() and (aside[0] / "report.json").exists()
    r = cli("run", str(task), "--out", ".", "--fresh", cwd=tmp_path / "run")
    assert r.returncode == 2 and "holds the working directory" in r.stderr


@pytest.mark.parametrize(
    "host_args, needle",
    [
        (["--port", "99999"], "Invalid value for '--port'"),
    ],
)
def test_serve_port_problems_are_one_line(tmp_path, host_args, needle):
    r = cli("serve", str(tmp_path), *host_args, cwd=tmp_path)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr

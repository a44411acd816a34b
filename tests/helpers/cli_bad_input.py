"""Every CLI entry point and option tried with bad input: how many still print a traceback (the
target is 0), and whether each exits with the code a user mistake gets (2; 1 for a run that
failed; 3 for the world failing).

    python tests/helpers/cli_bad_input.py            # each case in its own `python -m evolve` process
    python tests/helpers/cli_bad_input.py --inproc   # the same cases through evolve.cli.commands.main (fast; the tests)

It builds what the cases need in a temporary folder: a toy task file, a finished toy run, a file
where a folder is expected, a port that is taken. Prints one row per case and the totals.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "data" / "toy.yaml"


@dataclass(frozen=True)
class Case:
    args: tuple[
        str, ...
    ]  # {task} {deploy} {run} {file} {dir} {busy} {free} {bad_yaml} {list_yaml} {template} are filled in
    code: int  # the exit code a user should get
    what: str = ""


# (entry point, what is wrong) -> expected exit code
CASES: list[Case] = [
    # the root command
    Case(("--version",), 0),
    Case(("-V",), 0),
    Case(("-h",), 0),
    Case(("--help",), 0),
    Case((), 2, "no command"),
    Case(("--bogus",), 2),
    Case(("nosuchcommand",), 2),
    Case(("ru",), 2),
    # run
    Case(("run",), 2, "no task file"),
    Case(("run", "-h"), 0),
    Case(("run", "missing.yaml"), 2),
    Case(("run", "{bad_yaml}"), 2),
    Case(("run", "{list_yaml}"), 2),
    Case(("run", "{dir}"), 2, "a folder as task file"),
    Case(("run", "{task}", "--bogus"), 2),
    Case(("run", "{task}", "--set"), 2, "--set without value"),
    Case(("run", "{task}", "--set", "nokey"), 2),
    Case(("run", "{task}", "--set", "budget.generations=abc"), 2),
    Case(("run", "{task}", "--set", "budget.generations=-1"), 2),
    Case(("run", "{task}", "--set", "engine.minibach=3"), 2),
    Case(("run", "{task}", "--set", "operators.5.name=x"), 2),
    Case(("run", "{task}", "--set", "runner.name=thred"), 2),
    Case(("run", "{task}", "--set", "models.policy.params.temprature=0.1"), 2),
    Case(("run", "{task}", "--set", "models.policy.backend=litelm"), 2),
    Case(("run", "{task}", "--set", "failures.max_share=2"), 2),
    Case(("run", "{task}", "--set", "reward_range=[1,0]"), 2),
    Case(("run", "{task}", "--set", "seed=x"), 2),
    Case(("run", "{task}", "--set", "agent=no_such_mod:agent"), 2),
    Case(("run", "{task}", "--set", "reward=evolve.worlds.toy:rewrd"), 2),
    Case(("run", "{task}", "--set", "dataset.source=evolve.worlds.toy:nope"), 2),
    Case(("run", "{task}", "--set", "models.policy.params.reply=nope:reply"), 2),
    Case(("run", "{task}", "--out", "{file}"), 2, "--out names a file"),
    Case(("run", "{task}", "--out", "/proc/evolve-cannot-make-this"), 2, "--out cannot be made"),
    Case(("run", "{task}", "--out", "{run}"), 2, "--out holds a run"),
    Case(("run", "{task}", "--out", "{run}", "--resume", "--set", "seed=5"), 2, "resume with another task"),
    Case(("run", "{task}", "--out", "{run}", "--resume", "--fresh"), 2),
    Case(("run", "{task}", "--dry-run", "--set", "budget.rollouts=0"), 2),
    Case(("run", "{template}"), 2, "evolve init's template, data missing"),
    # eval
    Case(("eval",), 2),
    Case(("eval", "{task}"), 2),
    Case(("eval", "{task}", "nodir"), 2),
    Case(("eval", "{task}", "{file}"), 2),
    Case(("eval", "{task}", "{run}", "--system", "zzz"), 2),
    Case(("eval", "{task}", "{run}", "--split", "nosplit"), 2),
    Case(("eval", "missing.yaml", "{run}"), 2),
    # init
    Case(("init", "{task}"), 2, "exists"),
    Case(("init", "{dir}"), 2),
    Case(("init", "/nonexistent/x/t.yaml"), 2),
    # serve
    Case(("serve",), 2),
    Case(("serve", "nodir"), 2),
    Case(("serve", "{file}"), 2),
    Case(("serve", "{run}", "--port", "99999"), 2),
    Case(("serve", "{run}", "--port", "-1"), 2),
    Case(("serve", "{run}", "--port", "abc"), 2),
    Case(("serve", "{run}", "--port", "{busy}"), 2),
    Case(("serve", "{run}", "--role", "nope"), 2),
    Case(("serve", "{run}", "--system", "zzz"), 2),
    Case(("serve", "{run}", "--host", "10.254.254.254"), 2, "beyond loopback without a key"),
    Case(("serve", "{run}", "--host", "10.254.254.254", "--api-key", "k"), 2, "an address not on this machine"),
    Case(("serve", "{run}", "--poll", "0"), 2),
    # archive
    Case(("archive",), 2),
    Case(("archive", "list"), 2),
    Case(("archive", "list", "nodir"), 2),
    Case(("archive", "list", "{file}"), 2),
    Case(("archive", "show", "{run}", "zzz"), 2),
    Case(("archive", "show", "{run}"), 2),
    Case(("archive", "diff", "{run}", "zzz"), 2),
    Case(("archive", "diff", "{run}", "baseline", "zzz"), 2),
    Case(("archive", "rollback", "{run}", "zzz"), 2),
    Case(("archive", "export", "{run}", "zzz", "--to", "{dir}/x"), 2),
    Case(("archive", "export", "{run}", "baseline", "--to", "{file}"), 2),
    Case(("archive", "export", "{run}", "baseline"), 2),
    Case(("archive", "nosuch"), 2),
    # baseline (DSPy)
    Case(("baseline",), 2),
    Case(("baseline", "dspy"), 2),
    Case(("baseline", "dspy", "missing.yaml"), 2),
    Case(("baseline", "dspy", "{task}", "--optimizer", "nope"), 2),
    # gateway and traces
    Case(("gateway",), 2, "no config and no route"),
    Case(("gateway", "missing.yaml"), 2),
    Case(("gateway", "{bad_yaml}"), 2),
    Case(("gateway", "{list_yaml}"), 2),
    Case(("gateway", "{task}"), 2, "a task file"),
    Case(("gateway", "--upstream", "openai/*", "--port", "99999"), 2),
    Case(("gateway", "--upstream", "openai/*", "--port", "{busy}"), 2),
    Case(("gateway", "--upstream", "openai/*", "--host", "10.254.254.254"), 2, "beyond loopback without a key"),
    Case(("gateway", "--upstream", "openai/*", "--api-key-env", "EVOLVE_NO_SUCH_VAR"), 2),
    Case(("gateway", "--upstream", "openai/*", "--local", "{run}"), 2),
    Case(("gateway", "--local", "nodir"), 2),
    Case(("traces",), 2),
    Case(("traces", "ls", "nodir"), 2),
    Case(("traces", "show", "nodir", "s"), 2),
    Case(("traces", "feedback", "nodir", "s", "--score", "1"), 2),
    Case(("traces", "score", "nodir", "m:f"), 2),
    Case(("traces", "check", "{file}"), 2),
    Case(("run", "{task}", "--set", "runner.params.bogus=1"), 2, "a parameter the runner does not take"),
    Case(("run", "{task}", "--set", "runner.name=ray", "--set", "runner.params.artifacts=nfs"), 2),
    # promote, rollback, status
    Case(("promote", "{task}", "{run}"), 2, "no deploy section"),
    Case(("promote", "missing.yaml", "{run}"), 2),
    Case(("promote", "{deploy}", "nodir"), 2),
    Case(("promote", "{deploy}", "{run}"), 2, "nothing proposed"),
    Case(("promote", "{deploy}", "{run}", "--system", "zzzz"), 2),
    Case(("promote", "{deploy}", "{run}", "--approve"), 2),
    Case(("promote", "{deploy}", "{run}", "--set", "deploy.canary.share=2"), 2),
    Case(("rollback", "nodir"), 2),
    Case(("rollback", "{run}"), 2, "nothing earlier"),
    Case(("rollback", "{run}", "zzzz"), 2),
    Case(("status", "nodir"), 2),
    Case(("status", "{file}"), 2),
    # track, and the task file's track: section
    Case(("track",), 2),
    Case(("track", "nodir"), 2),
    Case(("track", "{file}"), 2),
    Case(("track", "{run}"), 2, "the run names no tracker"),
    Case(("track", "{run}", "--to", "mlfow"), 2),
    Case(("track", "{run}", "--to", "mlflow", "--param", "tracking_ur=x"), 2),
    Case(("track", "{run}", "--param", "x"), 2),
    Case(("track", "{run}", "--to", "mlflow", "--param", "tracking_uri=http://127.0.0.1:{free}"), 2, "no server there"),
    Case(("track", "{run}", "--to", "otel", "--param", "endpoint=http://127.0.0.1:{free}", "--param", "timeout=1"), 2),
    Case(("track", "{run}", "--to", "wandb", "--param", "mode=sometimes"), 2),
    Case(("run", "{task}", "--set", "track=[{{name: mlfow}}]"), 2),
    Case(("run", "{task}", "--set", "track=[{{name: otel, params: {{endpont: x}}}}]"), 2),
    Case(
        ("run", "{task}", "--set", "track=[{{name: mlflow, params: {{tracking_uri: 'http://127.0.0.1:{free}'}}}}]"),
        2,
        "the tracker does not answer: refused before the run directory is written",
    ),
]


COMMANDS = {
    "run",
    "eval",
    "init",
    "serve",
    "archive",
    "list",
    "show",
    "diff",
    "rollback",
    "export",
    "baseline",
    "dspy",
    "gateway",
    "traces",
    "ls",
    "feedback",
    "score",
    "check",
    "otel",
    "promote",
    "status",
    "track",
}


def entry_point(case: Case) -> str:
    """The command a case reaches: ``evolve``, ``evolve run``, ``evolve archive show``, ..."""
    words = ["evolve"]
    for a in case.args:
        if a not in COMMANDS:
            break
        words.append(a)
    return " ".join(words)


def prepare(tmp: Path) -> dict[str, str]:
    """The files and folders the cases name."""
    import evolve

    task = yaml.safe_load(TOY.read_text())
    task["budget"] = {"generations": 0}
    (tmp / "task.yaml").write_text(yaml.safe_dump(task))
    (tmp / "deploy.yaml").write_text(
        yaml.safe_dump({**task, "deploy": {"regression": {"tasks": "val", "min_tasks": 2}}})
    )
    (tmp / "bad.yaml").write_text("name: [unclosed\n")
    (tmp / "list.yaml").write_text("- a\n- b\n")
    (tmp / "a_file").write_text("not a folder\n")
    (tmp / "a_dir").mkdir()
    from evolve.api import TEMPLATE

    (tmp / "template.yaml").write_text(TEMPLATE.replace("backend: litellm", "backend: scripted"))
    with contextlib.redirect_stderr(io.StringIO()):
        evolve.run(tmp / "task.yaml", out=tmp / "run")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    prepare.busy = busy  # kept open while the cases run
    with socket.socket() as s:  # a port nothing listens on (a tracker that is not there)
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    return {
        "task": str(tmp / "task.yaml"),
        "deploy": str(tmp / "deploy.yaml"),
        "run": str(tmp / "run"),
        "file": str(tmp / "a_file"),
        "dir": str(tmp / "a_dir"),
        "busy": str(busy.getsockname()[1]),
        "bad_yaml": str(tmp / "bad.yaml"),
        "list_yaml": str(tmp / "list.yaml"),
        "template": str(tmp / "template.yaml"),
        "free": str(free),
    }


def fill(case: Case, paths: dict[str, str]) -> list[str]:
    return [a.format(**paths) for a in case.args]


def run_subprocess(args: list[str], cwd: Path) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "100"}
    try:
        p = subprocess.run(
            [sys.executable, "-m", "evolve", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as e:  # e.g. a server started on a bad option and listening on
        return -1, f"{e.stdout or ''}{e.stderr or ''}\n(still running after 60s: killed)"
    return p.returncode, p.stdout + p.stderr


def run_inproc(args: list[str], cwd: Path) -> tuple[int, str]:
    """Through evolve.cli.commands.main; an exception that escapes it is what a user would see as a traceback."""
    import traceback

    from evolve.cli.commands import main

    out, err = io.StringIO(), io.StringIO()
    old = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(args)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - this is the traceback a user would have seen
                err.write(traceback.format_exc())
                code = 1
    finally:
        os.chdir(old)
    return code, out.getvalue() + err.getvalue()


def check(inproc: bool = False, verbose: bool = True) -> list[tuple[Case, int, bool, str]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        paths = prepare(tmp)
        for case in CASES:
            args = fill(case, paths)
            code, text = (run_inproc if inproc else run_subprocess)(args, tmp)
            tb = "Traceback (most recent call last)" in text
            rows.append((case, code, tb, text))
            if verbose:
                mark = "TRACEBACK" if tb else ("ok" if code == case.code else f"exit {code}, expected {case.code}")
                last = next((ln.strip() for ln in reversed(text.strip().splitlines()) if ln.strip()), "")
                print(f"{mark:>24}  evolve {' '.join(case.args):60.60}  {last[:90]}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inproc", action="store_true", help="call evolve.cli.commands.main instead of a process per case")
    a = ap.parse_args()
    t0 = time.time()
    rows = check(inproc=a.inproc)
    tracebacks = sum(tb for _, _, tb, _ in rows)
    wrong = sum(code != c.code for c, code, _, _ in rows)
    points = len({entry_point(c) for c in CASES})
    print(
        f"\n{len(rows)} bad inputs over {points} entry points ({'in process' if a.inproc else 'a process each'}, "
        f"{time.time() - t0:.0f}s): {tracebacks} printed a traceback, {wrong} exited with another code than expected"
    )
    return 1 if tracebacks or wrong else 0


if __name__ == "__main__":
    sys.exit(main())

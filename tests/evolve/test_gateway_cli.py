"""evolve gateway as a process (kill -9 under load) and the evolve gateway / evolve traces commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from evolve.errors import UserError
from tests.helpers import ROOT
from tests.helpers.upstream import free_port, post

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


# ----------------------------------------------------------------------------- kill -9, the CLI


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the gateway exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the gateway did not start")


def test_kill_9_under_32_concurrent_sessions_loses_no_finished_call(upstream, tmp_path):
    from evolve.gateway import TraceStore

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "evolve",
            "gateway",
            "--upstream",
            "openai/*",
            "--api-base",
            upstream.url,
            "--store",
            str(tmp_path / "traces"),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        _wait_port(port, proc)
        done: dict[str, list[str]] = {}
        stop = threading.Event()

        def user(i: int) -> None:
            sid, ids = f"user-{i}", []
            done[sid] = ids
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    status, r = post(
                        f"http://127.0.0.1:{port}/v1/chat/completions",
                        {"model": "slow-20", "messages": [{"role": "user", "content": f"{i} {n}"}]},
                        {"x-evolve-session": sid},
                    )
                except OSError:
                    return  # the gateway died under this request: it never finished
                if status == 200:
                    ids.append(r["id"])

        threads = [threading.Thread(target=user, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        time.sleep(3.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    finished = {cid for ids in done.values() for cid in ids}
    store = TraceStore(tmp_path / "traces", create=False)
    stored = {c.id: c for c in store.calls()}
    assert len(finished) > 32  # calls did finish before the kill
    assert finished <= set(stored)  # every call an agent saw finish is in the store
    assert len(stored) - len(finished) <= 32  # at most the ones in flight at the kill (answered, never received)
    for sid, ids in done.items():
        assert [c.id for c in store.calls(sid)][: len(ids)] == ids  # in the order the agent made them
    assert store.integrity() == []


def test_the_traces_cli_lists_shows_and_takes_feedback(gw, capsys):
    from evolve.cli.commands import main

    post(
        gw.url + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "cli"}], "user": "cli-s"}
    )
    store = str(gw.cfg.store)
    main(["traces", "ls", store])
    assert "cli-s" in capsys.readouterr().out
    main(["traces", "feedback", store, "cli-s", "--score", "1", "--component", "correct=1", "--text", "good"])
    assert "recorded" in capsys.readouterr().out
    main(["traces", "show", store, "cli-s"])
    out = capsys.readouterr().out
    assert "echo: cli" in out and "score 1.0" in out
    main(["traces", "check", store])
    assert capsys.readouterr().out.strip() == "ok"
    with pytest.raises(SystemExit) as e:
        main(["traces", "feedback", store, "cli-s", "--component", "correct"])
    assert e.value.code == 2 and "NAME=NUMBER" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["traces", "show", store, "nobody"])
    assert "no session 'nobody'" in capsys.readouterr().err


def test_traces_cli_on_a_missing_store_is_a_user_error(tmp_path, capsys):
    from evolve.cli.commands import main

    with pytest.raises(SystemExit) as e:
        main(["traces", "ls", str(tmp_path / "none")])
    assert e.value.code == 2 and "no trace store" in capsys.readouterr().err
    with pytest.raises(UserError):
        from evolve.gateway import TraceStore

        TraceStore(tmp_path / "none", create=False)


def test_import_evolve_gateway_loads_no_http_stack():
    code = (
        "import sys, evolve, evolve.gateway, evolve.cli.gateway; "
        "bad = [m for m in ('starlette', 'uvicorn', 'litellm') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(ROOT), check=True)
    assert out.stdout.strip() == "[]"


def test_the_gateway_commands_say_what_is_wrong_without_a_traceback(tmp_path, capsys):
    from evolve.cli.commands import main

    for args, code, says in (
        (["gateway", str(tmp_path / "none.yaml")], 2, "no gateway config file"),
        (["gateway"], 2, "needs a gateway.yaml, --upstream MODEL or --local RUN_DIR"),
        (["gateway", "--upstream", "openai/x", "--local", str(tmp_path)], 2, "give one of"),
        (["gateway", "--upstream", "openai/x", "--host", "0.0.0.0"], 2, "needs an API key"),
        (["gateway", "--local", str(tmp_path / "nope")], 2, "not an evolvekit run directory"),
    ):
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err
        assert e.value.code == code and says in err and "Traceback" not in err, (args, err)

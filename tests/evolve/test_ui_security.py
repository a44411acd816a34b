"""The dashboard's guards: loopback unless told, a token beyond it, the Host header checked, paths
that climb out refused, nothing but GET, and the page's Content-Security-Policy; the command's
bad inputs are one line and exit 2."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

import evolve  # noqa: E402
from evolve.errors import ConfigError, UserError  # noqa: E402
from evolve.ui import serve  # noqa: E402
from evolve.ui.app import CSP, Sources, build_app  # noqa: E402

SCRIPTED = {"backend": "scripted", "name": "toy", "params": {"reply": "evolve.worlds.toy:reply"}}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uisec") / "toy"
    evolve.run(
        {
            "world": "toy",
            "models": {"policy": SCRIPTED},
            "prompts": {"instruction": "multiply"},
            "operators": [{"name": "scripted", "params": {"component": "instruction", "choices": ["add"]}}],
            "budget": {"generations": 1},
        },
        out=out,
    )
    return out


def test_beyond_loopback_a_token_is_required(run):
    with pytest.raises(ConfigError, match="needs a token"):
        serve([run], host="0.0.0.0")
    c = TestClient(build_app(Sources([run]), token="s3cret", hosts=["*"]), follow_redirects=False)
    assert c.get("/api/runs").status_code == 401 and "needs its token" in c.get("/").text
    assert c.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    first = c.get("/?token=s3cret")  # the printed URL: the token becomes a cookie and leaves the address bar
    assert first.status_code == 303 and "token" not in first.headers["location"]
    assert (
        "httponly" in first.headers["set-cookie"].lower() and "samesite=strict" in first.headers["set-cookie"].lower()
    )
    assert c.get("/api/runs").status_code == 200  # the cookie now


def test_a_foreign_host_header_is_refused_on_loopback(run):
    c = TestClient(build_app(Sources([run]), hosts=["127.0.0.1", "localhost"]), base_url="http://127.0.0.1")
    assert c.get("/api/runs").status_code == 200
    assert c.get("/api/runs", headers={"host": "evil.example:8765"}).status_code == 400  # DNS rebinding


@pytest.mark.parametrize(
    "path",
    [
        "/static/../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/static/..%2F..%2Fapp.py",
        "/api/runs/..%2F..%2Fetc/summary",
        "/api/runs/toy/systems/..%2F..%2F..%2Fetc%2Fpasswd",
        "/api/runs/toy/rollouts/..%2F1",
        "/api/traffic/..%2F..%2Ftmp/sessions",
        "/static/vendor/../../app.py",
    ],
)
def test_paths_that_climb_out_find_nothing(run, path):
    c = TestClient(build_app(Sources([run]), hosts=["testserver"]))
    r = c.get(path)
    assert r.status_code in (400, 404), (path, r.status_code)
    assert "root:" not in r.text and "def build_app" not in r.text


def test_only_reads_and_every_answer_carries_the_policy(run):
    c = TestClient(build_app(Sources([run]), hosts=["testserver"]))
    for method in ("post", "put", "delete", "patch"):
        assert getattr(c, method)("/api/runs").status_code == 405
    for path in ("/", "/api/runs", "/static/js/main.js", "/api/runs/nope/summary"):
        r = c.get(path)
        assert r.headers["content-security-policy"] == CSP and r.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP.split("script-src")[1].split(";")[0]
    assert c.get("/static/vendor/plotly.min.js").status_code == 200  # from the plotly wheel


def test_bad_paths_are_named_and_an_empty_folder_is_watched(tmp_path, run):
    with pytest.raises(UserError, match="does not exist"):
        Sources([tmp_path / "nope"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is not a folder"):
        Sources([tmp_path / "file"])
    watched = tmp_path / "runs"
    watched.mkdir()
    c = TestClient(build_app(Sources([watched]), hosts=["testserver"]))
    assert c.get("/api/runs").json()["runs"] == []
    shutil.copytree(run, watched / "later")  # a run that starts after the dashboard: found on the next look
    assert [r["id"] for r in c.get("/api/runs").json()["runs"]] == ["later"]


def _evolve(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_command_says_what_is_wrong_and_exits_2(run, tmp_path):
    for args, words in (
        (["ui", str(tmp_path / "nope")], "does not exist"),
        (["ui"], "no ./runs folder"),
        (["ui", str(run / "archive.sqlite")], "is not a folder"),
        (["ui", str(run), "--token-env", "EVOLVE_UI_NO_SUCH_VAR"], "not set"),
    ):
        r = _evolve(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert words in r.stdout + r.stderr and "Traceback" not in r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = _evolve("ui", str(run), "--port", str(taken.getsockname()[1]), cwd=tmp_path)
    assert r.returncode == 2 and "cannot listen" in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_the_command_serves_on_loopback(run, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolve", "ui", str(run), "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == f"evolve ui at http://127.0.0.1:{port}/"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=10) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.URLError):  # not on any other address of this machine
            other = socket.gethostbyname(socket.gethostname())
            if other.startswith("127."):
                raise urllib.error.URLError("only loopback here")
            urllib.request.urlopen(f"http://{other}:{port}/api/runs", timeout=5)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_any_loopback_address_it_is_bound_to_answers(run):
    with serve([run], host="127.0.0.2") as server:
        with urllib.request.urlopen(f"{server.base}/api/runs", timeout=10) as r:
            assert r.status == 200


def test_a_run_and_a_trace_store_in_one_folder_are_both_reachable(run, tmp_path):
    from evolve.gateway.traces import TraceStore

    both = tmp_path / "both"
    shutil.copytree(run, both)
    TraceStore(both).close()
    c = TestClient(build_app(Sources([both]), hosts=["testserver"]))
    listed = c.get("/api/runs").json()
    assert [t["id"] for t in listed["traffic"]] == ["both-traffic"]
    assert c.get("/api/traffic/both-traffic/sessions").status_code == 200

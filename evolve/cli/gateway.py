"""``evolve gateway`` (serve agents' traffic), ``evolve serve`` (its short form for one run's model) and
``evolve traces`` (look into a trace store, add feedback)."""

from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from evolve.errors import UserError

traces_app = typer.Typer(
    name="traces",
    help="Look into the gateway's trace store: sessions, calls, feedback.",
    no_args_is_help=True,
    add_completion=False,
)


def _out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def gateway_command(
    config: Path | None = typer.Argument(None, help="A gateway.yaml (routes, store, host, port); or give --upstream."),
    upstream: str | None = typer.Option(
        None,
        "--upstream",
        help="One route for every model: a litellm model "
        "name, '*' standing for the model the agent asks for (openai/*).",
    ),
    api_base: str | None = typer.Option(
        None, "--api-base", help="The upstream's base URL (vLLM, Ollama, any OpenAI-compatible server)."
    ),
    upstream_key_env: str | None = typer.Option(
        None, "--upstream-key-env", help="The variable holding the upstream's key."
    ),
    local: Path | None = typer.Option(
        None,
        "--local",
        help="One route for every model: the local model of this "
        "run directory's current system (followed as the archive promotes).",
    ),
    role: str = typer.Option("policy", "--role", help="With --local: the system's model role."),
    roles: str | None = typer.Option(
        None,
        "--roles",
        help="With --local: several roles of the system (a team), "
        "'all' or a comma-separated list, each answering to its role's name.",
    ),
    store: Path | None = typer.Option(None, "--store", help="The trace store's folder (default: traces)."),
    host: str | None = typer.Option(
        None, "--host", help="Address to bind (default 127.0.0.1); beyond loopback --api-key-env is required."
    ),
    port: int | None = typer.Option(None, "--port", min=0, max=65535, help="Port (default 4000)."),
    api_key_env: str | None = typer.Option(
        None, "--api-key-env", help="The variable holding the key agents must send."
    ),
) -> None:
    """Stand an OpenAI- and Anthropic-compatible gateway in front of your agent's model: point the
    agent's base URL at it, every call is recorded in the trace store."""
    from evolve.deploy.gateway import GatewayServer
    from evolve.gateway.config import from_flags, load_config

    if roles is not None and (local is None or role != "policy"):
        raise UserError("--roles goes with --local RUN_DIR, instead of --role (several roles, each under its own name)")
    if sum(x is not None for x in (config, upstream, local)) > 1:
        raise UserError("give one of a gateway.yaml, --upstream or --local (a file's routes say what the flags would)")
    if config is not None:
        cfg = load_config(config)
        over = {
            k: v
            for k, v in (("store", store), ("host", host), ("port", port), ("api_key_env", api_key_env))
            if v is not None
        }
        if over:
            cfg = cfg.model_validate({**cfg.model_dump(), **over})
    elif upstream is not None or local is not None:
        cfg = from_flags(
            upstream=upstream,
            api_base=api_base,
            upstream_key_env=upstream_key_env,
            local=local,
            role=role,
            roles=None
            if roles is None
            else roles
            if roles == "all"
            else [x.strip() for x in roles.split(",") if x.strip()],
            store=store or Path("traces"),
            host=host or "127.0.0.1",
            port=4000 if port is None else port,
            api_key_env=api_key_env,
        )
    else:
        raise UserError(
            "evolve gateway needs a gateway.yaml, --upstream MODEL or --local RUN_DIR, e.g. "
            "evolve gateway --upstream 'openai/*' --api-base http://127.0.0.1:8000/v1"
        )
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    server = GatewayServer(cfg, log=lambda m: err.print(m, markup=False))
    out = _out()
    out.print(f"gateway at {server.url} (OpenAI) and {server.base} (Anthropic); traces in {cfg.store}", markup=False)
    for r, built in zip(cfg.routes, server.gateway.routes, strict=True):
        if r.upstream is not None:
            what = f"{r.upstream.model}" + (f" at {r.upstream.api_base}" if r.upstream.api_base else "")
        elif r.local is not None and r.local.roles is not None:
            what = built.upstream.describe()
        else:
            assert r.local is not None  # a route has an upstream or a local model
            what = f"the local model of {r.local.run} ({r.local.role})"
        out.print(f"  route {r.name}: {', '.join(built.names())} -> {what}", markup=False)
    sys.stdout.flush()
    server.run()


def serve_command(
    run_dir: Path = typer.Argument(..., help="The run directory (holds archive.sqlite)."),
    role: str = typer.Option("policy", "--role", help="The system's model role to serve."),
    system: str | None = typer.Option(
        None,
        "--system",
        help="Serve this system (id prefix, best, baseline) "
        "instead of the current one; a pinned system is never swapped.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; beyond loopback an API key is required."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="EVOLVE_SERVE_API_KEY",
        help="Require 'Authorization: Bearer KEY' (env EVOLVE_SERVE_API_KEY).",
    ),
    no_follow: bool = typer.Option(
        False, "--no-follow", help="Keep serving the starting system even when the archive promotes another."
    ),
    poll: float = typer.Option(
        1.0, "--poll", min=0.01, help="Seconds between checks of the archive's current pointer."
    ),
) -> None:
    """Serve a system's model behind an OpenAI-compatible chat-completions endpoint (the gateway
    with one local route on the run, as `evolve gateway --local RUN_DIR`); calls are recorded in
    RUN_DIR/serve/calls.jsonl."""
    from evolve.gateway.asgi import is_loopback, wait_until_interrupted
    from evolve.gateway.run_route import ServeApp

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    with ServeApp(
        run_dir, role=role, system=system, follow=not no_follow, poll=poll, log=lambda msg: err.print(msg, markup=False)
    ) as sapp:
        server = sapp.start(host=host, port=port, api_key=api_key)  # listening before the URL is printed
        out = _out()
        where = "" if is_loopback(host) else f" (listening on {host}:{server.port}; use this machine's address)"
        out.print(f"serving {role!r} of system {sapp.system_id[:12]} at {server.url}{where}", markup=False)
        key = "$EVOLVE_SERVE_API_KEY" if api_key else "unused"
        out.print(
            f'example: OpenAI(base_url="{server.url}", api_key="{key}").chat.completions.create('
            f'model="{role}", messages=[{{"role": "user", "content": "hi"}}])',
            markup=False,
        )
        sys.stdout.flush()
        wait_until_interrupted()  # Ctrl-C or SIGTERM
        err.print("stopped", markup=False)


def _store(path: Path):
    from evolve.gateway.traces import TraceStore

    return TraceStore(path, create=False)


def _when(ts: float | None) -> str:
    return "-" if ts is None else _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


@traces_app.command("ls")
def ls(
    store: Path = typer.Argument(..., help="The trace store's folder."),
    limit: int = typer.Option(50, "--limit", min=1, help="Show the latest N sessions."),
) -> None:
    """List sessions: calls, feedback, the system that answered."""
    st = _store(store)
    rows = st.sessions()
    t = Table("started", "calls", "feedback", "route", "system")
    t.add_column("session", overflow="fold")  # whole: it is what `evolve traces show` takes
    for s in rows[-limit:]:
        t.add_row(
            _when(s["created"]),
            str(s["n_calls"]),
            str(s["n_feedback"]),
            s["route"] or "-",
            (s["system_id"] or "-")[:12],
            s["id"],
        )
    _out().print(t)
    c = st.counts()
    _out().print(f"{c['sessions']} sessions, {c['calls']} calls, {c['feedback']} feedback", markup=False)


@traces_app.command("show")
def show(
    store: Path = typer.Argument(..., help="The trace store's folder."),
    session: str = typer.Argument(..., help="A session id (see evolve traces ls)."),
    as_json: bool = typer.Option(False, "--json", help="Print the calls and feedback as JSON."),
) -> None:
    """One session: its calls (messages, tools called, answer) and feedback."""
    st = _store(store)
    calls = st.calls(session)
    if not calls:
        raise UserError(f"no session {session!r} in {store}; list them with: evolve traces ls {store}")
    fb = st.feedback_of(session_id=session)
    if as_json:
        from dataclasses import asdict

        print(json.dumps({"calls": [asdict(c) for c in calls], "feedback": [asdict(f) for f in fb]}, indent=2))
        return
    out = _out()
    for c in calls:
        out.print(
            f"[{c.seq}] {c.id} {c.api} {c.model} -> {c.upstream_model} {c.status} {(c.latency_s or 0) * 1000:.0f} ms",
            markup=False,
        )
        last = c.messages[-1] if c.messages else {}
        out.print(f"    {last.get('role')}: {str(last.get('content'))[:200]}", markup=False)
        if c.tool_calls:
            for tc in c.tool_calls:
                out.print(f"    -> tool {tc['function']['name']}({tc['function']['arguments'][:200]})", markup=False)
        if c.output:
            out.print(f"    assistant: {c.output[:200]}", markup=False)
        if c.error:
            out.print(f"    error: {c.error[:300]}", markup=False)
    for f in fb:
        out.print(f"feedback {f.id}: score {f.score} {f.components or ''} {f.text or ''}", markup=False)


@traces_app.command("feedback")
def feedback(
    store: Path = typer.Argument(..., help="The trace store's folder."),
    target: str = typer.Argument(..., help="A session id, or a call id (a response's id)."),
    score: float | None = typer.Option(None, "--score", help="The reward."),
    text: str | None = typer.Option(None, "--text", help="Feedback in words."),
    component: list[str] = typer.Option([], "--component", help="NAME=VALUE, repeatable."),
    id: str | None = typer.Option(None, "--id", help="An id of your own (sent twice, recorded once)."),
) -> None:
    """Attach a reward to a session or a call."""
    st = _store(store)
    comps = {}
    for c in component:
        name, sep, value = c.partition("=")
        try:
            comps[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise UserError(f"--component {c!r}: write NAME=NUMBER, e.g. --component correct=1")
    kind = "call_id" if st.call(target) is not None else "session_id"
    fb, new = st.feedback(**{kind: target}, score=score, text=text, components=comps or None, id=id, source="cli")
    _out().print(f"{'recorded' if new else 'already recorded'}: {fb.id} on session {fb.session_id}", markup=False)


@traces_app.command("score")
def score(
    store: Path = typer.Argument(..., help="The trace store's folder."),
    reward: str = typer.Argument(..., help="A reward function, module:function (task, output) -> score."),
    route: str | None = typer.Option(None, "--route", help="Only this route's sessions."),
    rescore: bool = typer.Option(False, "--rescore", help="Score sessions this reward scored already."),
) -> None:
    """Run a reward function over the recorded sessions; its verdicts become their feedback."""
    from evolve.gateway.dataset import score_sessions

    c = score_sessions(store, reward, route=route, rescore=rescore)
    _out().print(
        f"{c['scored']} sessions scored, {c['skipped']} skipped (scored before, or no answer), "
        f"{c['failed']} where the reward raised; {c['sessions']} in all",
        markup=False,
    )


@traces_app.command("otel")
def otel(
    store: Path = typer.Argument(..., help="The trace store's folder."),
    endpoint: str = typer.Option(..., "--endpoint", help="The OTLP/gRPC collector, e.g. http://127.0.0.1:4317."),
    session: str | None = typer.Option(None, "--session", help="Only this session's calls."),
    capture_content: bool = typer.Option(False, "--capture-content", help="Also send messages and answers."),
) -> None:
    """Send the recorded calls to an OpenTelemetry collector as gen_ai spans."""
    from evolve.errors import InfraError
    from evolve.gateway.otel import SpanExport

    calls = _store(store).calls(session)
    spans = SpanExport(endpoint, capture_content=capture_content)
    try:
        n = spans.send(calls)
    finally:
        spans.close()
    if spans.failed:
        raise InfraError(
            f"the collector at {endpoint} did not take {spans.failed} of {n} spans (see the messages "
            "above); check that it is running and speaks OTLP over gRPC, then run this again"
        )
    _out().print(f"sent {n} spans to {endpoint}", markup=False)


@traces_app.command("check")
def check(store: Path = typer.Argument(..., help="The trace store's folder.")) -> None:
    """Check the store's integrity (SQLite's own check, each session's calls)."""
    problems = _store(store).integrity()
    for p in problems:
        _out().print(p, markup=False)
    if problems:
        raise SystemExit(1)
    _out().print("ok", markup=False)

"""The MCP server's tools, one method each of :class:`Toolkit`; the server (:mod:`evolve.mcp.server`)
registers them by the names in :data:`TOOLS`, with each method's docstring as the description a
model reads and its type hints as the input schema.

Each tool checks its arguments (paths through :class:`~evolve.mcp.roots.Roots`) and raises a
:class:`~evolve.errors.UserError` with what to do instead; the server turns that into a tool
error. Whatever imports the task's own code runs in a child process (:mod:`evolve.mcp._worker`), which
carries the server's import guard (:mod:`evolve.mcp.guard`) in its environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context
from pydantic import Field

from evolve.errors import UserError
from evolve.mcp import views
from evolve.mcp.draft import DatasetSpec, ModelSpec, OperatorSpec, task_yaml
from evolve.mcp.grants import Grants
from evolve.mcp.guard import env_for
from evolve.mcp.jobs import JOB_FOLDER, Jobs
from evolve.mcp.roots import PathRefused, Roots

PathArg = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        description="a path inside the server's --root folders, relative to a root or absolute",
    ),
]
RunId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        description="the run id start_run or list_runs gave (the run directory, relative to a root)",
    ),
]
SystemRef = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="a system id (a unique prefix) or baseline / best / current",
    ),
]
Sets = Annotated[
    list[Annotated[str, Field(min_length=3, max_length=500, pattern=r"^[^=\s][^=]*=")]],
    Field(max_length=50, description="task-file overrides, e.g. ['budget.generations=2']"),
]
Progress = Callable[[float, float | None, str], Awaitable[None]]

TOOLS = (
    "init_task",
    "validate_task",
    "dry_run",
    "start_run",
    "resume_run",
    "run_status",
    "wait_run",
    "stop_run",
    "report",
    "compare_systems",
    "show_trajectory",
    "list_runs",
    "promote",
    "rollback",
    "deploy_status",
    "traces_summary",
)
MAX_ANSWER = 1 << 20  # bytes of a child's answer read


class Toolkit:
    """The tools over ``roots``; ``allow_deploy`` lets promote and rollback change what serves;
    ``grants``: the keys and hosts a client's task may name (:mod:`evolve.mcp.grants`)."""

    def __init__(self, roots: Roots, *, allow_deploy: bool = False, grants: Grants | None = None) -> None:
        self.roots, self.allow_deploy, self.jobs = roots, allow_deploy, Jobs()
        self.grants = grants or Grants()
        self.child_env = {**env_for(roots.folders), **self.grants.env()}  # the children's import guard and grants

    # ------------------------------------------------------------------ helpers

    def _run(self, run_id: str) -> tuple[Path, str]:
        try:
            p = self.roots.resolve(run_id, want="dir", what="run_id")
        except PathRefused as e:
            raise UserError(f"unknown run {run_id!r}: {e}; list_runs shows the runs") from None
        if not ((p / "archive.sqlite").exists() or (p / JOB_FOLDER / "job.json").exists()):
            raise UserError(f"unknown run {run_id!r}: {p} holds no run (no archive.sqlite); list_runs shows the runs")
        return p, self.roots.name(p)

    def _run_folder(self, run_dir: Path, given: str, what: str) -> None:
        """Refuse a run folder that is a root or holds one: a run (and ``fresh``, which moves the
        folder aside) gets a folder of its own."""
        held = [r for r in self.roots.folders if r == run_dir or r.is_relative_to(run_dir)]
        if held:
            which = "is the --root folder" if held[0] == run_dir else f"holds the --root folder {held[0]}"
            raise UserError(
                f"{what} {given!r} {which}; a run needs a folder of its own inside a root, e.g. runs/NAME (the default)"
            )

    def _deploy_allowed(self, what: str) -> None:
        if not self.allow_deploy:
            raise UserError(
                f"{what} changes which system serves users, and this server was started without "
                "--allow-deploy; ask the user to restart it with `evolve mcp --allow-deploy` (or to "
                f"run `evolve {what} ...` themselves). deploy_status shows the deployment meanwhile"
            )

    async def _child(
        self, args: list[str], *, timeout: float, progress: Progress | None = None, what: str = ""
    ) -> dict[str, Any]:
        """``python -m evolve.mcp._worker ARGS`` in its own session; its JSON answer, or a UserError
        with its message. Killed (the whole group) on timeout or when the call is cancelled."""
        argv = [sys.executable, "-m", "evolve.mcp._worker", *args]
        out, err = bytearray(), bytearray()
        started = time.monotonic()
        proc = await anyio.open_process(
            argv,
            cwd=self.roots.first,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "120", **self.child_env},
        )

        async def drain(stream: Any, buf: bytearray) -> None:
            async for chunk in stream:
                buf.extend(chunk[: max(0, MAX_ANSWER - len(buf))])

        async def tick() -> None:
            while proc.returncode is None:
                await anyio.sleep(1.0)
                if progress is not None and proc.returncode is None:
                    await progress(time.monotonic() - started, None, f"{what}: {time.monotonic() - started:.0f} s")

        try:
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(drain, proc.stdout, out)
                    tg.start_soon(drain, proc.stderr, err)
                    tg.start_soon(tick)
                    await proc.wait()
        except TimeoutError:
            raise UserError(f"{what} took longer than {timeout:g} s and was stopped; give a larger timeout_s") from None
        finally:
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                with anyio.CancelScope(shield=True):
                    await proc.wait()
        lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.strip()]
        try:
            answer = json.loads(lines[-1])
        except (IndexError, ValueError):
            tail = "\n".join(err.decode("utf-8", "replace").splitlines()[-8:])
            raise UserError(f"{what} ended (exit code {proc.returncode}) without an answer:\n{tail}") from None
        if not answer.get("ok"):
            raise UserError(answer.get("error") or f"{what} failed")
        return answer["result"]

    def _outside(self, files: list[str]) -> list[str]:
        return [f for f in files if not self.roots.holds(Path(f).resolve())]

    async def _validated(self, task: Path, sets: list[str], progress: Progress | None = None) -> dict[str, Any]:
        summary = await self._child(
            ["validate", str(task), *_set_args(sets)], timeout=300, progress=progress, what="validate_task"
        )
        outside = self._outside(summary.get("files", []))
        if outside:
            raise UserError(
                f"{self.roots.name(task)} names files outside the server's folders: {outside}; move them "
                "inside a --root folder"
            )
        summary["task_file"] = self.roots.name(task)
        return summary

    # ------------------------------------------------------------------ the task file

    async def init_task(
        self,
        path: PathArg,
        description: Annotated[
            str,
            Field(
                max_length=4000,
                description="in words: what the agent does, what its "
                "tasks look like, how an output is scored; becomes the file's comment",
            ),
        ],
        name: Annotated[
            str,
            Field(
                min_length=1,
                max_length=100,
                pattern=r"^[A-Za-z0-9_.-]+$",
                description="the task's name (its default run directory is runs/NAME-seedN)",
            ),
        ],
        models: Annotated[
            dict[str, ModelSpec],
            Field(
                max_length=10,
                description="role -> model; the agent calls ctx.llm(role); most tasks have one role, 'policy'",
            ),
        ],
        agent: Annotated[
            str | None,
            Field(
                max_length=300,
                description="import path of agent(task, ctx) -> output, "
                "e.g. my_agent:agent for my_agent.py beside the task file",
            ),
        ] = None,
        reward: Annotated[
            str | None,
            Field(
                max_length=300,
                description="import path of reward(task, output) -> a "
                "number in [0, 1], a dict with 'score', or an evolve.Reward",
            ),
        ] = None,
        world: Annotated[
            str | None, Field(max_length=100, description="a world (toy, sql) that fills agent, reward and dataset")
        ] = None,
        prompts: Annotated[
            dict[str, Annotated[str, Field(max_length=20000)]],
            Field(
                max_length=50,
                description="the starting prompt components the agent reads "
                "(ctx.system.prompts[NAME]); prompt operators evolve these",
            ),
        ] = {},  # noqa: B006 - the tool schema's default; never mutated
        dataset: Annotated[
            DatasetSpec | None, Field(description="the tasks: a generator or train/val/test JSONL files")
        ] = None,
        operators: Annotated[
            list[OperatorSpec], Field(max_length=20, description="what proposes better systems each generation")
        ] = [],  # noqa: B006 - the tool schema's default; never mutated
        budget: Annotated[
            dict[str, Any],
            Field(max_length=10, description="when to stop: generations, rollouts, calls, tokens, usd, seconds"),
        ] = {},  # noqa: B006 - the tool schema's default; never mutated
        extra: Annotated[
            dict[str, Any],
            Field(
                max_length=30,
                description="any other task-file field: seed, "
                "runner, engine, failures, workflow, tools, memory, deploy, track",
            ),
        ] = {},  # noqa: B006 - the tool schema's default; never mutated
        overwrite: Annotated[bool, Field(description="replace the file at path if it exists")] = False,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Write a task file (the YAML `evolve run` reads) from a description of the agent, its data and its
        reward, and validate it as a run would (agent and reward imported, dataset read) before it takes its
        place: an invalid draft is an error that names the YAML path and the fix, and nothing is written.
        Call dry_run next. The full field reference is the resource evolvekit://docs/task-file-reference."""
        target = self.roots.resolve(path, want="new", what="path")
        if target.suffix not in (".yaml", ".yml"):
            raise UserError(f"path {path!r}: a task file ends in .yaml or .yml")
        if target.exists() and not overwrite:
            raise UserError(f"{path} exists; pass overwrite=true to replace it, or choose another path")
        try:
            text = task_yaml(
                description=description,
                name=name,
                world=world,
                agent=agent,
                reward=reward,
                models=models,
                prompts=prompts,
                dataset=dataset,
                operators=operators,
                budget=budget,
                extra=extra,
            )
        except ValueError as e:
            raise UserError(str(e)) from None
        target.parent.mkdir(parents=True, exist_ok=True)
        draft = target.with_name(f".{target.stem}.draft-{os.getpid()}-{time.monotonic_ns()}{target.suffix}")
        draft.write_text(text)
        try:
            summary = await self._validated(draft, [], _reporter(ctx))
        except UserError as e:
            raise UserError(str(e).replace(str(draft), str(target)) + f"\n\nThe draft was:\n{text}") from None
        finally:
            draft.unlink(missing_ok=True)
        draft.write_text(text)
        draft.replace(target)
        summary["task_file"] = self.roots.name(target)
        return {
            "task_file": self.roots.name(target),
            "yaml": text,
            "summary": summary,
            "next": "dry_run to see what a run would spend, then start_run",
        }

    async def validate_task(self, path: PathArg, sets: Sets = [], ctx: Context | None = None) -> dict[str, Any]:  # noqa: B006 - the tool schema's default; never mutated
        """Check a task file as `evolve run` would before it spends anything: the YAML, every field (with
        'did you mean' on typos), the operators and their params, the agent and reward imported, the dataset
        read. Returns what the run would be (models, operators, budget, split sizes); an invalid file is an
        error naming the YAML path and the fix."""
        task = self.roots.resolve(path, want="file", what="path")
        return await self._validated(task, sets, _reporter(ctx))

    async def dry_run(self, path: PathArg, sets: Sets = [], ctx: Context | None = None) -> dict[str, Any]:  # noqa: B006 - the tool schema's default; never mutated
        """What a run of the task file would spend, before it spends anything: per phase (baseline, each
        generation, the final test scoring) the rollouts, LLM calls, tokens and money at most, and where a
        budget would stop it. Read it before start_run; tighten budget (sets=['budget.usd=2']) if it is too
        much. Runs nothing and writes nothing."""
        task = self.roots.resolve(path, want="file", what="path")
        est = await self._child(
            ["dry-run", str(task), *_set_args(sets)], timeout=300, progress=_reporter(ctx), what="dry_run"
        )
        total, stop = est["total"], est.get("stop")
        money = "unknown money" if total.get("usd") is None else f"${total['usd']:.4f}"
        est["summary"] = (
            f"at most {total['rollouts']} rollouts, {total['calls'] + total['op_calls']} LLM calls, "
            f"~{total['tokens']:,} tokens, {money} in all"
            + (f"; {stop['limit']} stops it in {stop['phase']}" if stop else "; no budget stops it early")
        )
        return views.clip(est)

    # ------------------------------------------------------------------ runs

    async def start_run(
        self,
        path: PathArg,
        out: Annotated[
            str | None,
            Field(
                max_length=1024,
                description="the run directory (default: the task's out, else runs/NAME-seedN in the first root)",
            ),
        ] = None,
        sets: Sets = [],  # noqa: B006 - the tool schema's default; never mutated
        fresh: Annotated[
            bool,
            Field(
                description="start over in a run directory that holds a run; the earlier "
                "run is moved aside to OUT.replaced-TIME, never deleted"
            ),
        ] = False,
    ) -> dict[str, Any]:
        """Start `evolve run` on a task file in the background and return its run id at once. The run is a
        process of its own: it goes on if this server stops, and its archive keeps every finished rollout.
        Follow it with run_status or wait_run; stop it with stop_run; continue a stopped run with resume_run."""
        task = self.roots.resolve(path, want="file", what="path")
        summary = await self._validated(task, sets)
        where = out or summary.get("out") or f"runs/{summary['name']}-seed{summary['seed']}"
        run_dir = self.roots.resolve(where, want="new", what="out")
        self._run_folder(run_dir, where, "out")
        st = await anyio.to_thread.run_sync(
            lambda: self.jobs.start(
                task, run_dir, sets, resume=False, fresh=fresh, cwd=self.roots.first, env=self.child_env
            )
        )
        return {
            "run_id": self.roots.name(run_dir),
            "run_dir": str(run_dir),
            **st,
            "task": summary,
            "next": "wait_run (progress as it goes) or run_status; report when it has finished",
        }

    async def resume_run(
        self,
        run_id: RunId,
        path: Annotated[
            str | None, Field(max_length=1024, description="the task file (default: the one it was started with)")
        ] = None,
        sets: Annotated[
            list[str] | None,
            Field(
                max_length=50,
                description="overrides (default: those it was "
                "started with); only budget, failures, deploy and track may "
                "change",
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Continue a stopped, interrupted or world-failed run in the background, reusing all its finished
        work (nothing finished is run again); to give it more budget, pass sets=['budget.generations=6']."""
        run_dir, rid = self._run(run_id)
        self._run_folder(run_dir, run_id, "run_id")
        job = self.jobs.job(run_dir) or {}
        given = path or job.get("task")
        if not given:
            raise UserError(f"{rid} was not started by this server; give path, the task file it was started with")
        task = self.roots.resolve(given, want="file", what="path")
        sets = list(job.get("sets", [])) if sets is None else sets
        for item in sets:
            if not isinstance(item, str) or "=" not in item or len(item) > 500:
                raise UserError(f"sets: {str(item)[:80]!r} is not key.path=value")
        await self._validated(task, sets)
        st = await anyio.to_thread.run_sync(
            lambda: self.jobs.start(
                task, run_dir, sets, resume=True, fresh=False, cwd=self.roots.first, env=self.child_env
            )
        )
        return {"run_id": rid, "run_dir": str(run_dir), **st, "next": "wait_run or run_status"}

    def _status(self, run_dir: Path, rid: str) -> dict[str, Any]:
        return views.status(run_dir, rid, self.jobs.state(run_dir), self.jobs.log_tail(run_dir))

    async def run_status(self, run_id: RunId) -> dict[str, Any]:
        """Where a run is: state (starting, running, finished, failed, refused, world_failed, stopped),
        generation of generations, budgets spent against their limits, the baseline's and the best system's
        scores with 95% intervals, failures per split with their most common messages, and what to do next."""
        run_dir, rid = self._run(run_id)
        return await anyio.to_thread.run_sync(self._status, run_dir, rid)

    async def wait_run(
        self,
        run_id: RunId,
        timeout_s: Annotated[
            float, Field(ge=1, le=3600, description="return after this long even if the run goes on")
        ] = 300,
        poll_s: Annotated[float, Field(ge=0.2, le=60, description="seconds between two looks at the run")] = 1.0,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Wait for a run to end (or timeout_s), sending progress notifications (generation of generations,
        best val so far) as it goes; returns run_status. Call it again while the run is still running."""
        run_dir, rid = self._run(run_id)
        progress = _reporter(ctx)
        deadline = time.monotonic() + timeout_s
        while True:
            st = await anyio.to_thread.run_sync(self._status, run_dir, rid)
            if st["state"] not in ("running", "starting"):
                return st
            if progress is not None:
                gen, total = st.get("generation"), st.get("generations")
                best = (st.get("best") or {}).get("val") or {}
                note = f"generation {gen if gen is not None else '-'}" + (f" of {total}" if total else "")
                if best.get("mean") is not None:
                    note += f", best val {best['mean']:.3f} (n={best['n']})"
                await progress(float(gen or 0), float(total) if total else None, note)
            if time.monotonic() >= deadline:
                return {**st, "note": f"still {st['state']} after {timeout_s:g} s; wait_run again"}
            await anyio.sleep(poll_s)

    async def stop_run(
        self,
        run_id: RunId,
        timeout_s: Annotated[
            float, Field(ge=0.1, le=600, description="seconds to wait after Ctrl-C before the run is terminated")
        ] = 30,
    ) -> dict[str, Any]:
        """Interrupt a running run as Ctrl-C would (what finished is kept; resume_run continues it); if it
        has not ended after timeout_s it is terminated, then killed, which loses only rollouts in flight."""
        run_dir, rid = self._run(run_id)
        return {"run_id": rid, **await anyio.to_thread.run_sync(self.jobs.stop, run_dir, timeout_s)}

    async def report(self, run_id: RunId) -> dict[str, Any]:
        """The finished run's report: the baseline and the best system on val and test, the paired
        comparison on the same tasks with its 95% interval and sign test, failures, budget used, and a
        reading in words. Quote gains with their interval; an interval that includes 0 is no gain."""
        run_dir, rid = self._run(run_id)
        return await anyio.to_thread.run_sync(views.report, run_dir, rid)

    async def compare_systems(
        self,
        run_id: RunId,
        a: SystemRef = "baseline",
        b: SystemRef = "best",
        other_run_id: Annotated[
            str | None, Field(max_length=1024, description="b's run, when it is another run's")
        ] = None,
    ) -> dict[str, Any]:
        """Two systems side by side: the component diff (prompts, models, memory, tools, workflow), their
        scores with intervals, and on the tasks both were scored on the paired gain of b over a with the
        tasks b fixed and broke. Default: the baseline against the best of one run."""
        a_dir, a_id = self._run(run_id)
        b_dir, b_id = self._run(other_run_id) if other_run_id else (a_dir, a_id)
        return await anyio.to_thread.run_sync(views.compare, a_dir, a_id, a, b_dir, b_id, b)

    async def show_trajectory(
        self,
        run_id: RunId,
        system: SystemRef = "best",
        seq: Annotated[
            int | None, Field(ge=0, lt=2**62, description="one rollout's seq (from a listing): shown whole")
        ] = None,
        split: Annotated[
            str | None,
            Field(pattern=r"^(train|val|test)$", description="only this split's rollouts: train, val or test"),
        ] = None,
        failed_only: Annotated[bool, Field(description="only rollouts that failed (scored 0 by an error)")] = False,
        task_id: Annotated[str | None, Field(max_length=200, description="only this task's rollouts")] = None,
        limit: Annotated[int, Field(ge=1, le=100, description="rollouts on the page")] = 10,
    ) -> dict[str, Any]:
        """The stored rollouts of a system (a page: task, split, score, error), or with seq one rollout
        whole: the messages, tool calls, the reward with its components and feedback, the error. Use
        failed_only=true to read why rollouts failed."""
        run_dir, rid = self._run(run_id)
        return await anyio.to_thread.run_sync(
            lambda: views.trajectories(
                run_dir, rid, system, seq=seq, split=split, failed=failed_only, task_id=task_id, limit=limit
            )
        )

    async def list_runs(
        self,
        folder: Annotated[
            str | None,
            Field(max_length=1024, description="only the runs under this folder of the roots (default: all of them)"),
        ] = None,
    ) -> dict[str, Any]:
        """The runs under the server's folders (or one folder in them): run id, task, state, generation,
        the best val score, why it stopped."""
        tops = [self.roots.resolve(folder, want="dir", what="folder")] if folder else self.roots.folders

        def scan() -> dict[str, Any]:
            rows: list[dict[str, Any]] = []
            for d in views.find_runs(tops):
                rid = self.roots.name(d)
                try:
                    st = self._status(d, rid)
                except Exception as e:  # noqa: BLE001 - a broken archive is listed, not fatal to the listing
                    rows.append({"run_id": rid, "state": "unreadable", "error": str(e)[:300]})
                    continue
                best = st.get("best") or {}
                rows.append(
                    {
                        "run_id": rid,
                        "task": st.get("task"),
                        "state": st["state"],
                        "generation": st.get("generation"),
                        "best": best.get("id"),
                        "best_val": (best.get("val") or {}).get("mean"),
                        "stop_reason": st.get("stop_reason"),
                    }
                )
            return {"runs": rows, "roots": [str(r) for r in self.roots.folders]}

        return await anyio.to_thread.run_sync(scan)

    # ------------------------------------------------------------------ deployment and traffic

    async def promote(
        self,
        path: PathArg,
        run_id: RunId,
        system: Annotated[
            SystemRef | None, Field(description="the candidate's system id (default: the run's latest proposed)")
        ] = None,
        approve: Annotated[bool, Field(description="approve the system waiting for a person's approval")] = False,
        repin: Annotated[
            bool, Field(description="accept the reward and suites as they are now, after a change the user reviewed")
        ] = False,
        timeout_s: Annotated[
            float, Field(ge=10, le=21600, description="seconds promote may take before it is stopped")
        ] = 1800,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Take a candidate (default: the run's latest proposed) through the task's deploy: policy: integrity
        checks, the paired no-worse-than-active regression gate and guards, then a canary, approval or
        activation. Returns each gate's evidence; a rejected candidate is not an error. Needs the server to
        have been started with --allow-deploy."""
        self._deploy_allowed("promote")
        task = self.roots.resolve(path, want="file", what="path")
        run_dir, rid = self._run(run_id)
        args = ["promote", str(task), str(run_dir), "--by", "evolve-mcp"]
        args += (["--system", system] if system else []) + (["--approve"] if approve else [])
        args += ["--repin"] if repin else []
        res = await self._child(args, timeout=timeout_s, progress=_reporter(ctx), what="promote")
        return views.clip({"run_id": rid, **res})

    async def rollback(
        self,
        run_id: RunId,
        system: Annotated[
            SystemRef | None, Field(description="the system to serve (default: the previous active one)")
        ] = None,
        why: Annotated[str | None, Field(max_length=500, description="recorded in the audit trail")] = None,
    ) -> dict[str, Any]:
        """Serve the previous active system (or the given one) to new sessions now; ends a canary. Deletes
        nothing: the audit trail records it. Needs the server to have been started with --allow-deploy."""
        self._deploy_allowed("rollback")
        run_dir, rid = self._run(run_id)
        from evolve.deploy.manage import rollback as rollback_

        res = await anyio.to_thread.run_sync(
            lambda: rollback_(run_dir, system, by="evolve-mcp", why=why or "rolled back through evolve mcp")
        )
        return {"run_id": rid, **res}

    async def deploy_status(
        self,
        run_id: RunId,
        traces: Annotated[
            str | None,
            Field(max_length=1024, description="a gateway trace store: also the canary's test on its traffic"),
        ] = None,
    ) -> dict[str, Any]:
        """The run's deployment: the active system, each system's lifecycle state, a canary under way (with
        its sequential test on a trace store's sessions), the audit trail and any inconsistency."""
        run_dir, rid = self._run(run_id)
        store = self.roots.resolve(traces, want="dir", what="traces") if traces else None
        from evolve.deploy.manage import status

        st = await anyio.to_thread.run_sync(lambda: status(run_dir, traces=store))
        st["trail"] = st["trail"][-50:]
        return views.clip(json.loads(json.dumps({"run_id": rid, **st}, default=str)))

    async def traces_summary(
        self,
        store: PathArg,
        sessions: Annotated[int, Field(ge=0, le=100, description="how many of the newest sessions to list")] = 10,
    ) -> dict[str, Any]:
        """A gateway's trace store (evolve gateway --store): calls, sessions and feedback counted, per route
        and serving system the sessions scored and their mean first score, and the newest sessions."""
        folder = self.roots.resolve(store, want="dir", what="store")
        return await anyio.to_thread.run_sync(views.traces, folder, self.roots.name(folder), sessions)


def _reporter(ctx: Context | None) -> Progress | None:
    """MCP progress notifications on the call's context (sent when the client asked for them)."""
    if ctx is None:
        return None

    async def report(done: float, total: float | None, message: str) -> None:
        await ctx.report_progress(done, total, message)

    return report


def _set_args(sets: list[str]) -> list[str]:
    """``--set=ITEM`` for each override (one argument: a value is never read as a flag); an item
    that is a flag rather than KEY.PATH=VALUE is refused by name."""
    for item in sets:
        if item.lstrip().startswith("-"):
            raise UserError(
                f"sets: {item!r} is a command-line flag, not a task-file override; a set is "
                "KEY.PATH=VALUE (e.g. budget.generations=2), and a run's folder is start_run's out"
            )
    return [f"--set={item}" for item in sets]


__all__ = ["TOOLS", "Toolkit"]

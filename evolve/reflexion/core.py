"""The Reflexion loop: attempt, evaluate, reflect, retry with the lessons in context, remember."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from evolve.rollout import LLMProvider, RolloutContext, RolloutTimeout, jsonable, run_agent, score
from evolve.types import (
    LLMCall,
    System,
    ToolCall,
    Trajectory,
    content_hash,
)

from .context import MODES, Lesson, LessonContext
from .reflect import (
    REFLECT_SYSTEM,
    Reflection,
    clean_reflection,
    clip,
    describe_task,
    feedback_text,
    output_text,
    reflection_messages,
)

if TYPE_CHECKING:
    from typing import Self

log = logging.getLogger("evolve.reflexion")

# reflector(attempt_index, messages) -> (text or None, the recorded call or None, error or None)
Reflector = Callable[[int, list], "tuple[str | None, LLMCall | None, str | None]"]


@dataclass(frozen=True)
class AttemptEvent:
    """What ``on_attempt`` receives after each scored attempt (and its reflection, if any)."""

    task_id: str
    index: int
    trajectory: Trajectory
    success: bool
    lessons: tuple[str, ...]  # the lessons the attempt had in context
    reflection: Reflection | None


@dataclass
class ReflexionResult:
    task_id: str
    output: Any = None  # the successful attempt's output, else the best-scoring (latest on ties)
    success: bool = False
    attempts: list[Trajectory] = field(default_factory=list)  # each one scored
    reflections: list[str] = field(default_factory=list)  # every lesson drawn, in order
    lessons_written: list[str] = field(default_factory=list)  # memory ids
    recalled: list[str] = field(default_factory=list)  # lessons recalled from memory before attempt 1
    recalled_ids: list[str] = field(default_factory=list)
    records: list[Reflection] = field(default_factory=list)  # the reflections with source, reason, call
    errors: list[str] = field(default_factory=list)  # evaluator / memory / hook failures (never raised)

    @property
    def score(self) -> float:
        return max((t.score for t in self.attempts), default=0.0)

    @property
    def reflection_calls(self) -> list[LLMCall]:
        return [r.call for r in self.records if r.call is not None]

    def summary(self) -> str:
        n, src = len(self.attempts), [r.source for r in self.records]
        verdict = f"solved on attempt {n}" if self.success else f"failed after {n} attempt{'s' * (n != 1)}"
        counts = ", ".join(f"{src.count(s)} {s}" for s in dict.fromkeys(src))
        return (
            f"task {self.task_id}: {verdict} (score {self.score:.2f}); {len(self.records)} reflection"
            f"{'s' * (len(self.records) != 1)}{f' ({counts})' if counts else ''}, {len(self.recalled)} recalled, "
            f"{len(self.lessons_written)} written" + (f"; {len(self.errors)} error(s)" if self.errors else "")
        )


class _SystemLLMs:
    """An LLM provider that builds each role's model once through ``evolve.registry.llm_backends``."""

    def __init__(self, artifacts: Any = None) -> None:
        from evolve.artifacts import ArtifactStore
        from evolve.llm.cache import LLMCache

        self.artifacts = (
            ArtifactStore(artifacts)
            if isinstance(artifacts, (str, bytes)) or hasattr(artifacts, "__fspath__")
            else artifacts
        )
        self._cache = LLMCache(self.artifacts)

    def __call__(self, system: System, role: str) -> Any:
        return self._cache.get(system.models[role])

    def close(self) -> None:
        self._cache.close()


class Reflexion:
    """Reflexion (Shinn et al. 2023) around any agent, at test time; see :mod:`evolve.reflexion`.

    ``reflect="model"``: the ``reflector_role`` model writes each lesson; an empty, over-long
    (``max_reflection_chars``), garbage or failed reflection is replaced by the feedback text,
    with the reason in :attr:`Reflection.reason`. ``reflect="feedback"``: the evaluator's
    feedback is the lesson, formatted by ``lesson_template`` (fields ``feedback``, ``output``,
    ``attempt``, ``score``) — for models too small to write useful reflections.
    ``remember``: which lessons go to ``memory`` — ``"all"``, ``"solved"`` (only from tasks
    finally solved) or ``"none"`` (recall only).
    """

    def __init__(
        self,
        agent: Callable | str,
        system: System | None = None,
        *,
        evaluator: Callable | str | None = None,
        reward: Callable | str | None = None,
        threshold: float = 1.0,
        max_attempts: int = 3,
        max_reflections: int = 3,
        reflector_role: str = "policy",
        reflect: str = "model",
        memory: Any = None,
        recall_k: int = 2,
        min_similarity: float | None = 0.3,
        inject: str = "system",
        inject_roles: Sequence[str] | None = None,
        temperature: float | None = None,
        llm_provider: Callable | None = None,
        artifacts: Any = None,
        timeout: float | None = None,
        seed: int = 0,
        on_attempt: Callable[[AttemptEvent], Any] | None = None,
        task_text: Callable[[Any], str] | None = None,
        max_reflection_chars: int = 600,
        reflection_max_tokens: int = 256,
        reflect_prompt: str = REFLECT_SYSTEM,
        lesson_template: str = "{feedback}",
        remember: str = "all",
    ) -> None:
        from evolve.registry import import_path

        judge = evaluator if evaluator is not None else reward
        if judge is None:
            raise ValueError("Reflexion needs an evaluator or the task's reward to judge attempts")
        self.agent = import_path(agent, what="agent") if isinstance(agent, str) else agent
        self.judge = import_path(judge, what="evaluator") if isinstance(judge, str) else judge
        if not callable(self.agent) or not callable(self.judge):
            raise TypeError("the agent and the evaluator must be callables (or 'module:name' paths)")
        if reflect not in ("model", "feedback"):
            raise ValueError(f"reflect must be 'model' or 'feedback', got {reflect!r}")
        if inject not in MODES:
            raise ValueError(f"inject must be one of {MODES}, got {inject!r}")
        if remember not in ("all", "solved", "none"):
            raise ValueError(f"remember must be 'all', 'solved' or 'none', got {remember!r}")
        if max_attempts < 1 or max_reflections < 0:
            raise ValueError("max_attempts must be >= 1 and max_reflections >= 0")
        if system is not None and reflect == "model" and reflector_role not in system.models:
            raise ValueError(
                f"the system has no model role {reflector_role!r} to reflect with; "
                f"it has {sorted(system.models)} (or use reflect='feedback')"
            )
        lesson_template.format(feedback="", output="", attempt=1, score=0.0)  # fail now, not mid-run
        self.system, self.threshold, self.max_attempts = system, float(threshold), int(max_attempts)
        self.max_reflections, self.reflector_role, self.reflect = int(max_reflections), reflector_role, reflect
        self.memory, self.recall_k, self.min_similarity, self.remember = memory, int(recall_k), min_similarity, remember
        self.inject, self.inject_roles, self.temperature = inject, inject_roles, temperature
        self.timeout, self.seed, self.on_attempt, self.task_text = timeout, int(seed), on_attempt, task_text
        self.max_reflection_chars, self.reflection_max_tokens = int(max_reflection_chars), int(reflection_max_tokens)
        self.reflect_prompt, self.lesson_template = reflect_prompt, lesson_template
        self._owned: _SystemLLMs | None = None
        if llm_provider is None:
            llm_provider = self._owned = _SystemLLMs(artifacts)
        self.llm_provider: LLMProvider = llm_provider

    # ------------------------------------------------------------------ entry points

    def solve(self, task: dict, *, seed: int | None = None) -> ReflexionResult:
        """Attempt ``task`` up to ``max_attempts`` times, each attempt its own scored rollout
        (attempt ``i`` runs with seed ``seed + i``; retries at ``temperature`` when set)."""
        if self.system is None:
            raise ValueError("solve() needs the system the agent runs under: Reflexion(agent, system, ...)")
        task = _with_id(task)
        base = self.seed if seed is None else int(seed)
        system = self.system

        def attempt(i: int, lessons: tuple[str, ...]) -> Trajectory:
            return run_agent(
                self._lesson_agent(lessons),
                system,
                task,
                self.llm_provider,
                seed=base + i,
                sample=i,
                temperature=self.temperature if i else None,
                timeout=self.timeout,
            )

        def reflector(i: int, messages: list) -> tuple[str | None, LLMCall | None, str | None]:
            role = self.reflector_role
            traj = run_agent(
                lambda t, ctx: ctx.llm(role).complete(messages, max_tokens=self.reflection_max_tokens).text,
                system,
                task,
                self.llm_provider,
                seed=10_000 + base + i,
                timeout=self.timeout,
            )
            calls = [s for s in traj.steps if isinstance(s, LLMCall)]
            error = traj.error.splitlines()[0].removeprefix("agent raised ") if traj.error else None
            return traj.output, (calls[0] if calls else None), error

        return self._loop(task, self.max_attempts, attempt, reflector)

    def run_in(self, task: dict, ctx: RolloutContext, *, max_attempts: int | None = None) -> ReflexionResult:
        """The same loop inside one rollout: every attempt's (and reflection's) LLM calls are steps
        of ``ctx``'s trajectory; attempt ``i`` runs with seed ``ctx.seed + i``; a ``reflexion`` tool
        step records each lesson. A rollout past its deadline stops the loop (the timeout propagates)."""
        n = self.max_attempts if max_attempts is None else max(1, int(max_attempts))

        def attempt(i: int, lessons: tuple[str, ...]) -> Trajectory:
            temp = ctx.temperature if i == 0 or self.temperature is None else self.temperature
            lctx = LessonContext(
                ctx, lessons, self.inject, roles=self.inject_roles, seed=ctx.seed + i, temperature=temp
            )
            n0, t0, output, error = len(ctx.steps), time.monotonic(), None, None
            try:
                output = self.agent(task, lctx)
            except RolloutTimeout:
                raise
            except Exception as e:  # noqa: BLE001 - an attempt that crashes is a failed attempt
                error = f"agent raised {type(e).__name__}: {e}"
            finally:
                lctx.close()
            steps = tuple(ctx.steps[n0:])
            tokens = sum(s.prompt_tokens + s.completion_tokens for s in steps if isinstance(s, LLMCall))
            return Trajectory(
                task_id=str(task["id"]),
                system_id=ctx.system.id,
                steps=steps,
                output=jsonable(output),
                error=error,
                tokens=tokens,
                duration=time.monotonic() - t0,
                sample=i,
                temperature=temp,
            )

        def reflector(i: int, messages: list) -> tuple[str | None, LLMCall | None, str | None]:
            n0 = len(ctx.steps)
            try:
                text = ctx.llm(self.reflector_role).complete(messages, max_tokens=self.reflection_max_tokens).text
                error = None
            except RolloutTimeout:
                raise
            except Exception as e:  # noqa: BLE001
                text, error = None, f"{type(e).__name__}: {e}"
            calls = [s for s in ctx.steps[n0:] if isinstance(s, LLMCall)]
            return text, (calls[0] if calls else None), error

        def record(rec: Reflection) -> None:
            ctx.add_step(
                ToolCall(
                    name="reflexion",
                    args={"attempt": rec.attempt, "score": rec.score, "source": rec.source, "reason": rec.reason},
                    result=rec.text,
                )
            )

        return self._loop(_with_id(task), n, attempt, reflector, on_lesson=record)

    # ------------------------------------------------------------------ the loop

    def succeeded(self, traj: Trajectory) -> bool:
        r = traj.reward
        return traj.error is None and r is not None and r.error is None and r.score >= self.threshold

    def _loop(
        self,
        task: dict,
        n: int,
        attempt: Callable[[int, tuple], Trajectory],
        reflector: Reflector,
        on_lesson: Callable[[Reflection], None] | None = None,
    ) -> ReflexionResult:
        res = ReflexionResult(task_id=str(task["id"]))
        self._recall(task, res)
        for i in range(n):
            lessons = self._context(res)
            traj = score(self.judge, task, attempt(i, lessons))
            res.attempts.append(traj)
            ok = self.succeeded(traj)
            rec = None
            if traj.reward is not None and traj.reward.error is not None:
                res.errors.append(f"attempt {i + 1}: {traj.reward.error}")  # nothing to learn from
            elif not ok and (i + 1 < n or (self.memory is not None and self.remember != "none")):
                rec = self._reflect(task, traj, i, lessons, reflector)
                res.records.append(rec)
                res.reflections.append(rec.text)
                if on_lesson is not None:
                    on_lesson(rec)
            self._notify(res, AttemptEvent(res.task_id, i, traj, ok, lessons, rec))
            if ok:
                res.success = True
                break
        best = max(range(len(res.attempts)), key=lambda j: (res.attempts[j].score, j))
        res.output = res.attempts[best].output
        self._remember(task, res)
        return res

    def _context(self, res: ReflexionResult) -> tuple[str, ...]:
        recent = list(dict.fromkeys(reversed(res.reflections)))[: self.max_reflections][::-1]
        if self.inject == "turns":  # each lesson carries the answer it was drawn from
            answers = {rec.text: _last_answer(res.attempts[rec.attempt], self.inject_roles) for rec in res.records}
            recent = [Lesson(text, answers.get(text)) for text in recent]
        return tuple(dict.fromkeys(res.recalled + recent))

    def _reflect(self, task: dict, traj: Trajectory, i: int, prior: Sequence[str], reflector: Reflector) -> Reflection:
        feedback = feedback_text(traj, self.threshold)
        fallback = clip(
            self.lesson_template.format(
                feedback=feedback, output=output_text(traj, 300), attempt=i + 1, score=traj.score
            ),
            self.max_reflection_chars,
        )
        if self.reflect == "feedback":
            return Reflection(i, fallback, "feedback", traj.score)
        messages = reflection_messages(
            describe_task(task, traj, self.task_text), traj, feedback, prior, self.reflect_prompt
        )
        try:
            text, call, error = reflector(i, messages)
        except RolloutTimeout:
            raise
        except Exception as e:  # noqa: BLE001
            text, call, error = None, None, f"{type(e).__name__}: {e}"
        if error is not None:
            return Reflection(
                i, fallback, "feedback", traj.score, reason=f"the reflector failed: {error}"[:300], call=call
            )
        lesson, why = clean_reflection(text, self.max_reflection_chars)
        if call is not None and call.finish_reason == "length":
            lesson, why = None, f"reflection too long (cut at reflection_max_tokens={self.reflection_max_tokens})"
        if lesson is None:
            raw = text[:2000] if isinstance(text, str) else None
            return Reflection(i, fallback, "feedback", traj.score, reason=why, raw=raw, call=call)
        return Reflection(i, lesson, "model", traj.score, call=call)

    def _notify(self, res: ReflexionResult, event: AttemptEvent) -> None:
        if self.on_attempt is None:
            return
        try:
            self.on_attempt(event)
        except Exception as e:  # noqa: BLE001 - a logging hook must not break a solve
            res.errors.append(f"on_attempt raised {type(e).__name__}: {e}")
            log.warning("reflexion: on_attempt raised %s: %s", type(e).__name__, e)

    # ------------------------------------------------------------------ memory

    def _recall(self, task: dict, res: ReflexionResult) -> None:
        if self.memory is None or self.recall_k <= 0:
            return
        try:
            hits = self.memory.search(
                describe_task(task, None, self.task_text),
                self.recall_k,
                kinds="lesson",
                min_similarity=self.min_similarity,
            )
            for hit in hits:
                lesson = str(hit.item.metadata.get("lesson") or hit.text)
                if lesson not in res.recalled:
                    res.recalled.append(lesson)
                    res.recalled_ids.append(hit.item.id)
                    self.memory.use(hit.item.id)
        except Exception as e:  # noqa: BLE001 - memory is an aid; a failing store must not stop the task
            res.errors.append(f"memory recall failed: {type(e).__name__}: {e}")
            log.warning("reflexion: memory recall failed: %s", e)

    def _remember(self, task: dict, res: ReflexionResult) -> None:
        if self.memory is None or self.remember == "none" or (self.remember == "solved" and not res.success):
            return
        desc = clip(describe_task(task, None, self.task_text), 400)
        try:
            for rec in res.records:
                meta = {
                    "task_id": res.task_id,
                    "attempt": rec.attempt,
                    "score": rec.score,
                    "source": rec.source,
                    "solved": res.success,
                    "lesson": rec.text,
                }
                mid = self.memory.add(memory_text(desc, rec.text), kind="lesson", metadata=meta)
                if mid not in res.lessons_written:
                    res.lessons_written.append(mid)
            if res.success:
                for mid in res.recalled_ids:
                    self.memory.strengthen(mid, reason=f"recalled for task {res.task_id}, which was solved")
        except Exception as e:  # noqa: BLE001
            res.errors.append(f"memory write failed: {type(e).__name__}: {e}")
            log.warning("reflexion: memory write failed: %s", e)

    # ------------------------------------------------------------------ plumbing

    def _lesson_agent(self, lessons: tuple[str, ...]) -> Callable:
        agent, mode, roles = self.agent, self.inject, self.inject_roles

        def attempt(task: dict, ctx: RolloutContext) -> Any:
            lctx = LessonContext(ctx, lessons, mode, roles=roles)
            try:
                return agent(task, lctx)
            finally:
                lctx.close()

        return attempt

    def close(self) -> None:
        """Close the LLMs this object built from the system (not those of a given ``llm_provider``)."""
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def memory_text(task_desc: str, lesson: str) -> str:
    """A memory item: the task it came from (what later tasks are matched on) and the lesson
    (what is put in context; also in the item's metadata ``lesson``)."""
    return f"Task: {task_desc}\nLesson: {lesson}"


def _with_id(task: Any) -> dict:
    if not isinstance(task, dict):
        raise TypeError(f"a task is a dict, got {type(task).__name__}")
    if "id" in task:
        return task
    try:
        tid = content_hash(task, 12)
    except (TypeError, ValueError):
        tid = "task"
    return {**task, "id": tid}


__all__ = ["AttemptEvent", "Reflexion", "ReflexionResult", "memory_text"]


def _last_answer(traj: Trajectory, roles: Any) -> str | None:
    calls = [s for s in traj.steps if isinstance(s, LLMCall) and (roles is None or s.role in roles)]
    return calls[-1].output if calls else None

"""Reflexion mode (Shinn et al. 2023), at test time, around any agent.

When an attempt fails — judged by the task's reward, or by an evaluator you supply (a checker
that needs no gold answer) — a model writes a short reflection on what went wrong; the
reflection goes into the context of the next attempt (the most recent ``max_reflections`` of
them), and the lesson is written to a memory store, from which later, similar tasks recall
lessons before their first attempt.

    from evolve.reflexion import Reflexion
    rx = Reflexion(agent, system, reward=reward, max_attempts=3, memory=store, temperature=0.8)
    res = rx.solve(task)          # ReflexionResult: output, success, attempts, reflections, ...
    print(res.summary())

* The agent is unmodified: each attempt's rollout context hands it models that put the lessons in
  every message list (``inject="system"``: a system message "Lessons from earlier attempts:
  - ...", merged into a leading one; ``inject="user"``: appended to the first user message, for
  models trained without system messages). The recorded LLM calls show the lessons.
* ``evaluator(task, output, trajectory)`` (or ``(task, output)``) returns a float, a bool, a
  :class:`~evolve.types.Reward` or a dict with ``score``; success is ``score >= threshold``. Its
  ``feedback`` text is what the reflector (or, with ``reflect="feedback"``, the next attempt) sees.
  An evaluator that raises fails the attempt, recorded in ``result.errors``; the next one runs.
* ``reflect="model"`` asks ``reflector_role``'s model; a bad reflection (empty, longer than
  ``max_reflection_chars``, garbage, or a failed call) is replaced by the feedback text, with the
  reason recorded. ``reflect="feedback"`` uses the feedback verbatim: for models too small to
  reflect (such as the SQL world's tiny model).
* Only the LLM protocol is used, so litellm, local and scripted backends all work. Models are built
  from the system through :data:`evolve.registry.llm_backends` (``artifacts=`` the run's artifact
  folder for local weights), or given: ``llm_provider=lambda system, role: app.llm(role)`` for an
  ``evolve.load(run_dir)`` app, or an engine :class:`~evolve.runners.Worker`'s ``.llm``.
* Inside the engine: :func:`reflexion_agent` wraps an agent so that all attempts run inside one
  rollout; ``agent: evolve.worlds.sql:reflexion_agent`` is the SQL world's agent with Reflexion.
"""

from .agent import reflexion_agent
from .context import HEADER, Lesson, LessonContext, LessonLLM, format_lessons, inject
from .core import AttemptEvent, Reflexion, ReflexionResult, memory_text
from .reflect import REFLECT_SYSTEM, Reflection, clean_reflection, describe_task

__all__ = [
    "HEADER",
    "Lesson",
    "REFLECT_SYSTEM",
    "AttemptEvent",
    "LessonContext",
    "LessonLLM",
    "Reflection",
    "Reflexion",
    "ReflexionResult",
    "clean_reflection",
    "describe_task",
    "format_lessons",
    "inject",
    "memory_text",
    "reflexion_agent",
]

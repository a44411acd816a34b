"""Archives the dashboard's tests look at: a large lineage, and a system with memory, tools and a
workflow graph (its parent reads an earlier memory version; the run's tool operator judged two tools)."""

from __future__ import annotations

import json
from pathlib import Path

from evolve.archive import Archive
from evolve.types import System


def big_archive(d: Path, accepted: int = 20, rejected_each: int = 24) -> tuple[Path, list[str]]:
    """A chain of ``accepted`` accepted systems, each but the last with ``rejected_each`` rejected children."""
    chain = []
    with Archive(d) as a:
        parent = None
        for g in range(accepted):
            s = System(prompts={"p": f"accepted {g}"})
            a.add_system(s, parents=[parent] if parent else [], operator="op" if parent else "init", generation=g)
            for k in range(rejected_each if g < accepted - 1 else 0):
                a.add_system(
                    System(prompts={"p": f"rejected {g}.{k}"}), parents=[s.id], operator="op", generation=g + 1
                )
            chain.append(s.id)
            parent = s.id
        a.put_state("baseline", chain[0])
        a.put_state("best", chain[-1])
        a.put_state("accepted", [{"system_id": sid, "score": 0.0, "generation": g} for g, sid in enumerate(chain)])
        a.set_current(chain[-1])
    return d, chain


def layered_run(d: Path) -> tuple[Path, System, System, tuple[int, int]]:
    """``d/layers``: a parent and a child that adds memory items, a tool and a workflow graph;
    returns the run, both systems and the two memory versions they read."""
    from evolve.memory.embed import HashingEmbedder
    from evolve.memory.store import MemoryStore
    from evolve.worlds.sql.workflow import repair_loop

    store = MemoryStore(d / "mem", embedder=HashingEmbedder())
    first = store.add("use count(*) for how many", kind="experience")
    v1 = store.version
    store.supersede(first, "use count(*) for 'how many' questions", kind="experience")
    store.add("join on the _id column", kind="experience")
    v2 = store.version
    store.close()
    tool = {
        "name": "count_where",
        "params": ["db", "t", "c", "v"],
        "code": "def count_where(db, t, c, v): ...",
        "tests": [{"kwargs": {"db": "x"}, "expect": 1}],
        "origin": "abstraction",
        "uses": 3,
        "successes": 2,
    }
    parent = System(prompts={"p": "x"}, memory={"store": str(d / "mem"), "version": v1})
    child = System(
        prompts={"p": "x"},
        memory={"store": str(d / "mem"), "version": v2},
        tools={"count_where": tool},
        workflow={"graph": repair_loop(3), "max_turns": 3},
    )
    run = d / "layers"
    with Archive(run) as a:
        a.add_system(parent)
        a.add_system(child, parents=[parent.id], operator="memory", generation=1)
        a.put_state("baseline", parent.id)
        a.set_current(child.id)
    work = run / "work" / f"g1-op0-{parent.id[:8]}"
    work.mkdir(parents=True)
    (work / "toolforge.json").write_text(
        json.dumps(
            {
                "admitted": [{"tool": "count_where", "signature": "count_where(db, t, c, v)", "passed": 4, "total": 4}],
                "rejected": [
                    {"tool": "bad", "signature": "bad(db)", "passed": 1, "total": 4, "reason": "3 of 4 cases fail"}
                ],
                "duplicates": [],
                "retired": [],
            }
        )
    )
    return run, parent, child, (v1, v2)

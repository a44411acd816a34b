"""Which prompt layout SmolLM2-135M-Instruct can answer the SQL world in (issue 40).

    .venv/bin/python bench/worlds/smollm_layouts.py                       # every layout, 100 tasks each
    .venv/bin/python bench/worlds/smollm_layouts.py --n 40 --only base,create

The untouched model, greedy, one turn, on the first ``--n`` tasks of validation then training of
``examples/sql_agent/task_smollm.yaml``'s dataset (seed 0; train-side schemas, never the test
split), every prompt submitted at once to one local model server (batched). A layout is a
system instruction, a user message and, for some, stop strings or an assistant prefix (the reply
is taken to start with ``SELECT``: the toolkit's agents do not prefill, so those rows say what a
prefill would add). Prints per layout: execution matches, queries that ran, seconds.
"""

from __future__ import annotations

import argparse
import time

INSTR = (
    "You write SQLite queries. Given a database schema and a question, reply with one SQL query that "
    "answers it, and nothing else."
)
PLAIN = (
    "Translate the question into one SQLite query over the tables given. Use only the tables and columns "
    "shown. Reply with the query only."
)


def layouts() -> dict:
    from evolve.worlds.sql.render import as_ddl, pruned

    def ddl(t: dict) -> str:
        return as_ddl(t["schema"]) + f"\n\nQuestion: {t['question']}"

    # name -> (system, user(task), stop, prefix)
    return {
        "base": (INSTR, lambda t: f"{t['schema']}\nq: {t['question']}", None, ""),
        "base_prefix": (INSTR, lambda t: f"{t['schema']}\nq: {t['question']}", None, "SELECT"),
        "create": (INSTR, ddl, None, ""),
        "create_q": (INSTR, lambda t: as_ddl(t["schema"]) + f"\nq: {t['question']}", None, ""),
        "create_stop": (INSTR, ddl, [";", "\n\n"], ""),
        "create_prefix_stop": (INSTR, ddl, [";", "\n\n"], "SELECT"),
        "pruned_stop": (
            INSTR,
            lambda t: as_ddl(pruned(t["schema"], t["question"])) + f"\n\nQuestion: {t['question']}",
            [";", "\n\n"],
            "",
        ),
        "no_instruction_stop": (
            "",
            lambda t: as_ddl(t["schema"]) + f"\n\nWrite a SQLite query for: {t['question']}",
            [";", "\n\n"],
            "",
        ),
        "other_instruction_stop": (PLAIN, ddl, [";", "\n\n"], ""),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    from evolve._env import quiet_defaults

    quiet_defaults()
    from evolve.policy.gguf import SMOLLM2, checkpoint
    from evolve.policy.hf import load_pretrained
    from evolve.policy.local_server import LocalServer
    from evolve.types import Message
    from evolve.worlds.sql.dataset import dataset
    from evolve.worlds.sql.db import SQLError, clean_sql, execute
    from evolve.worlds.sql.reward import reward

    d = dataset(seed=0, n_train=400, n_val=100, n_test=300)
    tasks = (d["val"] + d["train"])[: a.n]
    model, tok = load_pretrained(checkpoint(SMOLLM2), device="cpu", dtype="float32")
    server = LocalServer(model, tok, name="smollm2", max_batch=64)
    chosen = [x for x in a.only.split(",") if x] or list(layouts())
    try:
        for name in chosen:
            system, user, stop, prefix = layouts()[name]
            t0, futures = time.time(), []
            for t in tasks:
                msgs = ([Message(role="system", content=system)] if system else []) + [
                    Message(role="user", content=user(t))
                ]
                ids = tok.render_chat(msgs, add_generation_prompt=True) + (tok.encode(prefix) if prefix else [])
                futures.append((t, server.submit(ids, temperature=0.0, max_tokens=80, stop=stop, seed=0)))
            right = ran = 0
            for t, f in futures:
                text = tok.decode(f.result().token_ids)
                query = clean_sql((prefix + " " if prefix else "") + text)
                right += reward(t, query).score >= 1.0
                try:
                    execute(t["db"], query)
                    ran += 1
                except SQLError:
                    pass
            print(f"| {name} | {len(tasks)} | {right} | {ran} | {time.time() - t0:.0f} s |", flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()

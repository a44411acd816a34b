"""What a second role's adapter costs the local backend: resident memory and sampling speed with one
role (one LoRA adapter) against two roles on the same base (two adapters), each arm in a fresh process.

Arms (``--engine torch`` or ``ctranslate2``):

* ``one``: one role, its adapter, served by :func:`evolve.policy.local.build`;
* ``two``: two roles on one base, each its own adapter: ``build`` shares one server (one base in
  memory; torch: peft's adapters by name; CTranslate2: one converted entry per adapter);
* ``two_copies`` (torch): two roles, each with its own server and its own copy of the base: what one
  process or model copy per role would hold.

Each arm loads, then samples the same greedy workload per role (``--prompts`` chats, ``--max-new``
tokens, all submitted at once so the server batches them; with two roles both roles' requests are
in flight together) ``--repeats`` times. Memory: resident set after loading minus before (``load``),
and the peak (``peak``), from /proc/self/status; speed: completion tokens per second of the whole
workload (median of the repeats). The tiny config model is a tiny Llama built from a config
(``--size tiny``: d_model 96, 2 layers, as examples/multi_agent/tiny.yaml; ``--size small``: d_model
512, 8 layers, ~26M parameters, where the base's memory shows above the process's own).

    python bench/sampling/roles_memory.py --size tiny --out bench/sampling/roles_memory.json
    python bench/sampling/roles_memory.py --size small --engine ctranslate2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

SIZES = {
    "tiny": {"d_model": 96, "n_layers": 2, "n_heads": 4, "d_ff": 192, "max_len": 256},
    "small": {"d_model": 512, "n_layers": 8, "n_heads": 8, "d_ff": 1536, "max_len": 256},
}


def status(key: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def make_files(size: str, folder: Path) -> tuple[Path, list[Path]]:
    """A tiny base and two random (non-zero) LoRA adapters, written as the archive stores them."""
    import copy
    import warnings

    import torch
    from peft import LoraConfig, get_peft_model

    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model
    from evolve.policy.weights import adapter_from_model, save_base

    cfg = TinyConfig(**SIZES[size], init_std=0.3)
    model = build_model(cfg, seed=0)
    save_base(model, CharTokenizer(), cfg, folder / "base.st")
    adapters = []
    for k in range(2):
        torch.manual_seed(k + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            pm = get_peft_model(
                copy.deepcopy(model),
                LoraConfig(
                    r=16, lora_alpha=32, init_lora_weights=False, target_modules=["q_proj", "v_proj", "up_proj"]
                ),
            )
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.05)
        adapters.append(folder / f"adapter{k}.st")
        adapter_from_model(pm).save(adapters[-1])
    return folder / "base.st", adapters


def warm_up(threads: int) -> None:
    """Import what loading imports and run one batch through a throwaway server on a minute model,
    so that ``load`` counts the base and adapters, not the libraries. On the development machine the
    first local server a process starts sampled about 30x slower than any later one (seen with and
    without build(), whichever came first; not explained yet), so every arm pays that here, not in
    the figures."""
    from evolve.policy.local import LocalLM
    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model
    from evolve.types import Message

    cfg = TinyConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=64)
    llm = LocalLM.from_model(build_model(cfg, seed=0), CharTokenizer(), temperature=0.0, max_tokens=4, threads=threads)
    llm.complete([Message(role="user", content="hi")])
    llm.close()


def arm(args: argparse.Namespace) -> dict:
    """One arm in this process: load, then sample; the figures as a dict."""
    import concurrent.futures as cf

    import torch

    from evolve.artifacts import ArtifactStore
    from evolve.policy.local import LocalLM, LocalServer, build
    from evolve.policy.weights import load_base
    from evolve.types import Message, ModelSpec

    torch.set_num_threads(args.threads)
    folder = Path(args.folder)
    store = ArtifactStore(folder / "artifacts")
    base = store.put_file(folder / "base.st", "base_weights")
    adapters = [store.put_file(folder / f"adapter{k}.st", "adapter") for k in range(2)]
    params = {
        "temperature": 0.0,
        "max_tokens": args.max_new,
        "threads": args.threads,
        **({"engine": "ctranslate2", "compute_type": "float32"} if args.engine == "ctranslate2" else {}),
    }
    warm_up(args.threads)
    before = status("VmRSS")
    t0 = time.perf_counter()
    if args.arm == "two_copies":
        llms = []
        for ref in adapters:
            model, tok, _ = load_base(store.path(base))
            server = LocalServer(model, tok, name="tiny", threads=args.threads)
            server.add_adapter(ref.sha256, store.path(ref))
            llms.append(
                LocalLM(
                    server,
                    name="tiny",
                    adapter=ref.sha256,
                    temperature=0.0,
                    max_tokens=args.max_new,
                    on_close=server.close,
                )
            )
    else:
        roles = adapters[:1] if args.arm == "one" else adapters
        llms = [build(ModelSpec(name="tiny", base=base, adapter=ref, params=params), store) for ref in roles]
    servers = len({id(llm.server) for llm in llms})
    chats = [
        [Message(role="user", content=f"question {i}: spell {'abcdefghij'[i % 10 :]} backward")]
        for i in range(args.prompts)
    ]
    load_s = time.perf_counter() - t0

    def workload() -> tuple[float, int]:
        t = time.perf_counter()
        futures: list[cf.Future] = [llm.submit(c, seed=i) for i, c in enumerate(chats) for llm in llms]
        tokens = sum(len(f.result().token_ids) for f in futures)
        return time.perf_counter() - t, tokens

    workload()  # warm-up (CTranslate2 loads an entry on first use)
    runs = [workload() for _ in range(args.repeats)]
    loaded = status("VmRSS") - before
    for llm in llms:
        llm.close()
    seconds = statistics.median(s for s, _ in runs)
    return {
        "arm": args.arm,
        "engine": args.engine,
        "roles": len(llms),
        "servers": servers,
        "load_mib": round(loaded / 2**20, 1),
        "peak_mib": round(status("VmHWM") / 2**20, 1),
        "load_s": round(load_s, 2),
        "tokens": runs[0][1],
        "seconds": round(seconds, 3),
        "tokens_per_s": round(runs[0][1] / seconds, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--engine", choices=["torch", "ctranslate2"], default="torch")
    ap.add_argument("--prompts", type=int, default=32, help="chats per role in one workload")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        print(json.dumps(arm(args)))
        return
    arms = ["one", "two"] + (["two_copies"] if args.engine == "torch" else [])
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "EVOLVE_CACHE_DIR": str(Path(d) / "cache")}
        make_files(args.size, Path(d))
        rows = []
        for name in arms:
            cmd = [
                sys.executable,
                __file__,
                "--arm",
                name,
                "--folder",
                d,
                "--size",
                args.size,
                "--engine",
                args.engine,
                "--prompts",
                str(args.prompts),
                "--max-new",
                str(args.max_new),
                "--repeats",
                str(args.repeats),
                "--threads",
                str(args.threads),
            ]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(f"arm {name} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{name:>10}: {rows[-1]}", flush=True)
    record = {
        "date": date.today().isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads},
        "size": args.size,
        "config": SIZES[args.size],
        "engine": args.engine,
        "prompts_per_role": args.prompts,
        "max_new": args.max_new,
        "repeats": args.repeats,
        "rows": rows,
    }
    if args.out:
        old = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps([*old, record], indent=1) + "\n")


if __name__ == "__main__":
    main()

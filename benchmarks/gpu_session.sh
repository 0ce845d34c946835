#!/usr/bin/env bash
# One prepared call on a lent NVIDIA GPU machine: the `gpu` tests, then benchmarks/gpu.py runs.
#
#   bash benchmarks/gpu_session.sh TESTS RUN...
#     TESTS   pytest paths of the gpu tests to run first, or "none"
#     RUN     one benchmarks/gpu.py run each, as MINUTES:MODELS:BATCHES (e.g. 1:gemm:1 0:resnet18,bert:1,16),
#             or "tiles": benchmarks/gpu_tiles.py
#
# The GPU machine has PyTorch, onnx, onnxruntime, cuda-bindings and NVRTC but not llvmlite 0.50, xgboost
# or tflite: those travel in .whl/ (ignored by git) as llvmlite.tar.xz (the wheel's files, xz-compressed
# so that they fit the 64 MiB transfer) and wheels. Logs and tuning records go to $OUT; records of an
# earlier call, carried in .records/ (ignored by git), are copied there first, so tuning resumes from them.
set -u
tests=$1
shift
out=${OUT:-/tmp/aotc-gpu-out}
site=/tmp/aotc-site
mkdir -p "$out" "$site"
start=$(date +%s)
if ls .records/*.jsonl >/dev/null 2>&1; then cp .records/*.jsonl "$out/"; fi
if [ -f .whl/llvmlite.tar.xz ]; then tar xJf .whl/llvmlite.tar.xz -C "$site"; fi
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
fi
export PYTHONPATH=$site:$PWD:$PWD/runtime PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,utilization.gpu --format=csv,noheader
python3 -c "
import importlib
for m in ['numpy', 'llvmlite', 'onnx', 'onnxruntime', 'xgboost', 'torch', 'cuda.bindings']:
    try:
        print(m, importlib.import_module(m).__version__, end='; ')
    except Exception as e:
        print(m, 'MISSING', e, end='; ')
print()
"
echo "setup: $(($(date +%s) - start)) s; load: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$tests" != none ]; then
    parallel=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
    # shellcheck disable=SC2086
    timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs $parallel --durations=8 $tests 2>&1 \
        | tee "$out/tests.log" | tail -60
    echo "tests done at $(($(date +%s) - start)) s"
fi
for run in "$@"; do
    if [ "$run" = tiles ]; then  # the untuned tilings under other preferences (benchmarks/gpu_tiles.py)
        python3 benchmarks/gpu_tiles.py 2>&1 | tee "$out/tiles.log"
        echo "tiles done at $(($(date +%s) - start)) s"
        continue
    fi
    IFS=: read -r minutes models batches <<<"$run"
    python3 benchmarks/gpu.py --minutes "$minutes" --models "$models" --batches "$batches" --rounds 2 \
        --repeat 10 --records "$out" --log "$out/build.log" --profile 8 2>&1 | tee -a "$out/bench.log"
    echo "run $run done at $(($(date +%s) - start)) s"
done
ls -la "$out"

#!/usr/bin/env bash
# One call on a lent GPU machine (see ../shared/notes/gpu-device.md): evjax travels with the
# working tree (PYTHONPATH=.), nothing is installed.  Run from the repository root:
#
#     bash benchmarks/gpu_check.sh            # writes logs and tables under $OUT (default /tmp/gpu_out)
#
# 1. tests/cudasim (every family's Numba CUDA kernels through the property harness) on the device,
#    in parallel worker processes;
# 2. the `gpu`-marked tests, less the one that reruns step 1 in a subprocess;
# 3. benchmarks/gpu_event.py --quick.
# Each step has its own time limit (T1, T2, T3 seconds), so one hang cannot eat the others' time.
set -u
# Wheels carried in .whl/ (git-ignored) go first on the path: the image's numpy 2.5 breaks numba-cuda
# 0.30.4's import (np.row_stack is gone), so carry numpy 2.4 there (seen 2026-11-27).
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT="${OUT:-/tmp/gpu_out}"
mkdir -p "$OUT"
nvidia-smi -L
python3 - <<'EOF'
import importlib.metadata as md
import jax
print("jax", jax.__version__, jax.devices())
import numpy
print("numpy", numpy.__version__)
for name in ("numba", "numba-cuda", "warp-lang", "cupy-cuda13x"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "absent")
EOF

step() {  # step NAME LIMIT COMMAND...
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - start)) s"
    tail -n 25 "$OUT/$name.log"
}

step cudasim_on_gpu "${T1:-220}" env EVJAX_CUDA_TESTS_ON_GPU=1 \
    python3 -m pytest -q -n 8 -p no:cacheprovider tests/cudasim
step gpu_tests "${T2:-150}" \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests -k "not simulator_tests_of_every_family"
step gpu_event "${T3:-120}" python3 benchmarks/gpu_event.py --quick --out "$OUT/gpu_event.md"

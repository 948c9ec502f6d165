#!/usr/bin/env bash
# The GPU checks of onlinefa in one run, for a machine with an NVIDIA GPU that may have no network and another
# Python than the one the wheel was built with. It builds nothing: it installs the abi3 wheel built elsewhere
# (no dependencies; PyTorch, Triton, NumPy, pytest and pytest-timeout must be there), runs the `cuda`-marked
# tests, then the benchmarks of benches/device.py. About 5 minutes on one H100; each step has its own limit.
#
#   maturin build --release -o wheelhouse          # on the build machine: the cp310-abi3 wheel
#   bash benches/gpu_check.sh [WHEEL] [OUT_DIR]    # on the GPU machine; default: wheelhouse/*.whl, $OUT or gpu-check
#
# Writes card.txt, cuda-tests.txt, updates.md, snapshot.md and sharded.md to OUT_DIR; their tables go into
# docs/performance.md with the card named.
set -uo pipefail
cd "$(dirname "$0")/.."

wheel=${1:-$(ls wheelhouse/onlinefa-*-abi3-*.whl 2>/dev/null | head -n 1)}
out=${2:-${OUT:-gpu-check}}
mkdir -p "$out"
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
    echo "no onlinefa abi3 wheel found (build one with: maturin build --release -o wheelhouse)" >&2
    exit 2
fi
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$wheel" || exit 2
export PYTHONPATH="$site" PYTHONUNBUFFERED=1
failed=0

run() {  # run NAME SECONDS COMMAND...: the command's output to OUT/NAME and the terminal; a failure is counted
    local name=$1 seconds=$2
    shift 2
    echo "== $name"
    if ! timeout "$seconds" "$@" 2>&1 | tee "$out/$name"; then
        echo "!! $name failed or ran past ${seconds} s" | tee -a "$out/$name"
        failed=$((failed + 1))
    fi
}

run card.txt 30 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "
import sys, torch, onlinefa
print(\"python\", sys.version.split()[0], \"torch\", torch.__version__, \"onlinefa\", onlinefa.__version__,
      \"from\", onlinefa.__file__)
print(\"GPUs:\", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"'
run cuda-tests.txt 180 python3 -m pytest -q -m cuda -p no:cacheprovider tests/torch/test_cuda.py
run updates.md 150 python3 benches/device.py --devices cuda --d 100000000 --k 10,20 --dtypes float32 \
    --passes plain,triton --no-host --models OnlineEM --repeats 7
run snapshot.md 90 python3 benches/device.py --snapshot-cost --k 10,20 --repeats 7
run sharded.md 60 python3 benches/device.py --sharded --d 100000000 --k 10,20 --repeats 7
echo "gpu_check: $failed step(s) failed; results in $out"
exit $((failed > 0))

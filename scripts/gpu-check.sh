#!/usr/bin/env bash
# The GPU check, one command, on a machine with an NVIDIA GPU, torch with
# CUDA and python3 (no Rust needed: scripts/gpu-bundle.sh built gpu-bundle/
# elsewhere). Every step runs under a timeout and is reported, pass or fail;
# everything goes to OUT (default ./gpu-check-out) and one tarball,
# OUT/gpu-check.tar.gz. Exit status 1 if a step failed.
#
#   bash scripts/gpu-check.sh [OUT]
#
# Steps: the CUDA backend's real-device tests (ignored elsewhere:
# `cuda-tests --ignored real_device`), a replay of a bundled trace on GPU 0
# (`cachealloc replay --backend cuda`), python/tests/test_native.py (the C++
# allocator for torch built against this machine's torch and driven on the
# simulated device), and python/tests/gpu_check.py (the workload matrix,
# torch's allocator against cachealloc's native one, JSON summary).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$PWD/gpu-check-out}"
bundle="$root/gpu-bundle"
mkdir -p "$out"
status=0
step() { # NAME SECONDS COMMAND...
  local name=$1 secs=$2
  shift 2
  echo "== $name"
  if timeout "$secs" "$@" >"$out/$name.log" 2>&1; then
    echo "ok   $name" | tee -a "$out/steps.txt"
  else
    echo "FAIL $name (exit $?)" | tee -a "$out/steps.txt"
    status=1
  fi
  tail -n 5 "$out/$name.log"
}
: >"$out/steps.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1 || true
export CACHEALLOC_TESTDATA="$root/tests/data"
step rust-real-device 240 "$bundle/cuda-tests" --ignored real_device --nocapture --test-threads=1
step replay-cuda 120 "$bundle/cachealloc" replay --backend cuda --json "$root/tests/data/traces/resnet50-train.jsonl.gz"
export PYTHONPATH="$root/python" CACHEALLOC_LIB="$bundle/libcachealloc.so"
export CACHEALLOC_CACHE="${CACHEALLOC_CACHE:-/tmp/cachealloc-native-cache}"
step native-allocator 90 python3 -m unittest "$root/python/tests/test_native.py" -v
step gpu-matrix 390 python3 "$root/python/tests/gpu_check.py" --out "$out/gpu-summary.json"
tar -czf "$out/gpu-check.tar.gz" -C "$out" --exclude gpu-check.tar.gz .
echo "gpu-check: $(grep -c '^ok' "$out/steps.txt") ok, $(grep -c '^FAIL' "$out/steps.txt") failed; $out/gpu-check.tar.gz"
exit $status

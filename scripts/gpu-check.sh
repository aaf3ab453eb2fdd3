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
# torch's allocator against cachealloc's native one, JSON summary and the
# README status table's GPU column, gpu-status.md).
#
# Wall time: at most 5 minutes. The first three steps run at once (the
# native-allocator step also builds the C++ allocator into the cache the
# matrix then loads); the matrix follows, 8 processes at a time.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$PWD/gpu-check-out}"
bundle="$root/gpu-bundle"
mkdir -p "$out"
status=0
step() { # NAME SECONDS COMMAND...: its log, and one line in steps.txt
  local name=$1 secs=$2 t0=$SECONDS rc=0
  shift 2
  echo "== $name (at most $secs s)"
  timeout "$secs" "$@" >"$out/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    echo "ok   $name ($((SECONDS - t0)) s)" | tee -a "$out/steps.txt"
  else
    echo "FAIL $name (exit $rc after $((SECONDS - t0)) s)" | tee -a "$out/steps.txt"
  fi
  tail -n 5 "$out/$name.log"
  return $rc
}
: >"$out/steps.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1 || true
export CACHEALLOC_TESTDATA="$root/tests/data"
export PYTHONPATH="$root/python" CACHEALLOC_LIB="$bundle/libcachealloc.so"
export CACHEALLOC_CACHE="${CACHEALLOC_CACHE:-/tmp/cachealloc-native-cache}"
export GPUCHECK_COMMIT="$(cat "$bundle/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
t0=$SECONDS
step rust-real-device 60 "$bundle/cuda-tests" --ignored real_device --nocapture --test-threads=1 & a=$!
step replay-cuda 60 "$bundle/cachealloc" replay --backend cuda --json "$root/tests/data/traces/resnet50-train.jsonl.gz" & b=$!
step native-allocator 100 python3 -m unittest "$root/python/tests/test_native.py" -v & c=$!
for pid in $a $b $c; do wait "$pid" || status=1; done
step gpu-matrix 180 python3 "$root/python/tests/gpu_check.py" --jobs 8 --timeout 120 \
  --out "$out/gpu-summary.json" --status-md "$out/gpu-status.md" || status=1
echo "gpu-check: $((SECONDS - t0)) s in all" | tee -a "$out/steps.txt"
tar -czf "$out/gpu-check.tar.gz" -C "$out" --exclude gpu-check.tar.gz .
echo "gpu-check: $(grep -c '^ok' "$out/steps.txt") ok, $(grep -c '^FAIL' "$out/steps.txt") failed; $out/gpu-check.tar.gz"
exit $status

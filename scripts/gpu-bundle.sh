#!/usr/bin/env bash
# Build here what the GPU check runs on a machine with an NVIDIA GPU but no
# Rust (scripts/gpu-check.sh there), into gpu-bundle/ (git-ignored; carry
# it with the working tree):
#   libcachealloc.so          the C library, CUDA backend (the Python package loads it)
#   cachealloc                the command, with --features cuda (replay --backend cuda)
#   cuda-tests                the CUDA backend's test binary (its ignored real-device tests)
#   COMMIT                    the commit it was built from
#
#   bash scripts/gpu-bundle.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/gpu-bundle"
cd "$root"
rm -rf "$out" && mkdir -p "$out"
cargo build --release -p cachealloc-capi
cargo build --release -p cachealloc-cli --features cuda
target="${CARGO_TARGET_DIR:-target}"
cp "$target/release/libcachealloc.so" "$target/release/cachealloc" "$out/"
# Without debug symbols: the bundle travels (7 MB instead of 88).
strip "$out/cachealloc" "$out/libcachealloc.so"
# The commit the GPU check reports (the GPU machine may have no git).
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD || commit="$commit+changes"
echo "$commit" >"$out/COMMIT"
# The test binary of backend-cuda/tests/cuda.rs (cargo names it cuda-HASH).
exe=$(cargo test --release -p cachealloc-cuda --test cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda":
        print(m["executable"])')
cp "$exe" "$out/cuda-tests"
strip "$out/cuda-tests"
ls -la "$out"
echo "gpu-bundle: ready (carry gpu-bundle/ and run scripts/gpu-check.sh on the GPU machine)"

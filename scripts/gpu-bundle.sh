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
#
# The builds are the README's (release) and `cargo test --workspace`'s (the
# test binary, selected with --workspace --test cuda so that its features
# are the workspace's): after those, nothing here compiles again.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/.ci/step.sh"
out="$root/gpu-bundle"
cd "$root"
rm -rf "$out" && mkdir -p "$out"
target="$(.ci/target-dir)"

step "release: the C library and the command"
cargo build --release -p cachealloc-capi
cargo build --release -p cachealloc-cli --features cuda
cp "$target/release/libcachealloc.so" "$target/release/cachealloc" "$out/"

step "the CUDA backend's test binary"
# backend-cuda/tests/cuda.rs (cargo names it cuda-HASH).
exe=$(cargo test --workspace --test cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda":
        print(m["executable"])')
[ -n "$exe" ] || { echo "gpu-bundle: cargo built no test binary named cuda" >&2; exit 1; }
cp "$exe" "$out/cuda-tests"

step "strip, and the commit"
# Without debug symbols: the bundle travels to the GPU machine.
strip "$out/cachealloc" "$out/libcachealloc.so" "$out/cuda-tests"
# The commit the GPU check reports (the GPU machine may have no git).
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD || commit="$commit+changes"
echo "$commit" >"$out/COMMIT"
ls -la "$out"
echo "gpu-bundle: ready (carry gpu-bundle/ and run scripts/gpu-check.sh on the GPU machine)"

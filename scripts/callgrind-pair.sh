#!/bin/bash
# Instructions per cache-hit pair (BENCHMARKS.md): callgrind counts of N =
# 200000 pairs minus N = 100000, so start-up cancels out. Of the core's
# `pair_loop` (with a settings string CONF, `locked`: through the lock), or
# with `c` of the C library's pair (`capi/examples/pair_cost N c`).
# usage: scripts/callgrind-pair.sh [CONF] [locked] | scripts/callgrind-pair.sh c   (needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = c ]; then
  cargo build -q --release -p cachealloc-capi --example pair_cost
  bin=${CARGO_TARGET_DIR:-target}/release/examples/pair_cost
  name="C library (cachealloc_alloc + cachealloc_free)"
else
  cargo build -q --release -p cachealloc-core --example pair_loop
  bin=${CARGO_TARGET_DIR:-target}/release/examples/pair_loop
  name="pair_loop ${*:-(default)}"
fi
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$@" 2>&1 |
        grep -o 'Collected : [0-9]*' | grep -o '[0-9]*'
}
a=$(count 200000 "$@")
b=$(count 100000 "$@")
echo "$name: $(((a - b) / 100000)) instructions per pair"

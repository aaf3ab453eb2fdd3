#!/bin/bash
# Instructions per cache-hit pair of the core (BENCHMARKS.md, "The torch
# version setting"): callgrind counts of `pair_loop 200000` minus
# `pair_loop 100000`, so start-up cancels out.
# usage: scripts/callgrind-pair.sh [CONF] [locked]   (needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p cachealloc-core --example pair_loop
bin=${CARGO_TARGET_DIR:-target}/release/examples/pair_loop
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$@" 2>&1 |
        grep -o 'Collected : [0-9]*' | grep -o '[0-9]*'
}
a=$(count 200000 "$@")
b=$(count 100000 "$@")
echo "pair_loop ${*:-(default)}: $(((a - b) / 100000)) instructions per pair"

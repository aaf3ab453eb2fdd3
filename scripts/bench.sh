#!/usr/bin/env bash
# BENCHMARKS.md's tables for this machine: runs every benchmark, keeps the
# raw outputs in OUT (default target/bench), and prints the tables in
# markdown with the commit, the date and the machine.
#
#   bash scripts/bench.sh [OUT]            # 8 to 13 minutes on 2 cores
#   BENCH_QUICK=1 bash scripts/bench.sh    # a minute: checks the script, not the figures
#
# Needs Rust and python3; valgrind for the instruction counts (skipped,
# saying so, without it); CACHEALLOC_TORCH_PYTHON=/path/to/venv/bin/python
# (a Python with a CUDA build of torch) adds the C++ allocator's pair. Run it on an otherwise idle machine: the figures
# of a busy one are not comparable.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${1:-$root/target/bench}"
target="${CARGO_TARGET_DIR:-$root/target}"
mkdir -p "$out"
rm -f "$out"/*.txt "$out"/*.jsonl "$out"/*.json
rm -rf "$target/criterion"
quick="${BENCH_QUICK:-}"
start=$(date +%s)
say() { echo "bench: $* ($(( $(date +%s) - start )) s)" >&2; }

# Criterion: long enough for a stable median on this VM, short enough for
# the whole script to fit its budget.
if [ -n "$quick" ]; then
  crit=(--warm-up-time 0.2 --measurement-time 0.5 --noplot)
  runs=1; scale_sizes=(1000 100000); pairs=200000
else
  crit=(--warm-up-time 1 --measurement-time 3 --noplot)
  runs=3; scale_sizes=(1000 100000 1000000); pairs=2000000
fi
traces=(tests/data/traces/*.jsonl.gz)

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
python3 - "$out/meta.json" "$commit" "${quick:+quick}" <<'EOF'
import json, os, platform, subprocess, sys, datetime
cpu = "unknown"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip(); break
except OSError:
    pass
mem = 0
try:
    mem = int(open("/proc/meminfo").readline().split()[1]) * 1024
except (OSError, ValueError, IndexError):
    pass
rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
json.dump({"commit": sys.argv[2], "quick": bool(sys.argv[3]),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
           "os": platform.platform(), "rustc": rustc}, open(sys.argv[1], "w"))
EOF

say "building"
cargo build -q --release -p cachealloc-cli -p cachealloc-capi
cargo build -q --release -p cachealloc-capi --example pair_cost --example threads_cost \
  --example release_stall
cargo build -q --release -p cachealloc-core --example pair_loop
cachealloc="$target/release/cachealloc"

say "hot path and scaling (criterion)"
cargo bench -q -p cachealloc-core --bench hot_path -- "${crit[@]}" >"$out/hot_path.txt" 2>&1
say "threads on one CachingAllocator (criterion, std's lock)"
cargo bench -q -p cachealloc-core --features std --bench threads -- "${crit[@]}" >"$out/threads.txt" 2>&1
say "replay, peers and fragmentation (criterion)"
cargo bench -q -p cachealloc-cli --bench replay -- "${crit[@]}" >"$out/replay.txt" 2>&1

say "the C library's pair against the core's"
"$target/release/examples/pair_cost" "$pairs" >"$out/pair_cost.txt"
say "threads through the C library"
"$target/release/examples/threads_cost" $((pairs / 2)) >"$out/threads_cost.txt"
say "releasing 16,384 segments while another device runs pairs"
"$target/release/examples/release_stall" >"$out/release_stall.txt"

if command -v valgrind >/dev/null; then
  say "instructions per pair (callgrind)"
  for conf in "" "expandable_segments:True" "roundup_power2_divisions:4"; do
    bash scripts/callgrind-pair.sh "$conf" >>"$out/callgrind.txt"
  done
  bash scripts/callgrind-pair.sh "" locked >>"$out/callgrind.txt"
  bash scripts/callgrind-pair.sh c >>"$out/callgrind.txt"
else
  echo "valgrind not installed: no instruction counts" >"$out/callgrind.txt"
fi

say "policies side by side (compare --min-capacity)"
"$cachealloc" compare -q --json --min-capacity --conf "" --conf expandable_segments:True \
  --conf policy:compact "${traces[@]}" >"$out/compare.jsonl"

say "a fresh stream per step"
"$cachealloc" generate fresh-streams "$out/fresh.jsonl.gz" >/dev/null
"$cachealloc" compare -q --json --conf "" --conf expandable_segments:True --conf policy:compact \
  "$out/fresh.jsonl.gz" >"$out/fresh.jsonl"
"$cachealloc" compare -q --json --capacity 4GiB --conf "" --conf expandable_segments:True \
  --conf policy:compact "$out/fresh.jsonl.gz" >"$out/fresh-4gib.jsonl"

say "end to end (replay --json, $runs runs per trace)"
for t in "${traces[@]}"; do
  for _ in $(seq "$runs"); do "$cachealloc" replay --json "$t" >>"$out/end_to_end.jsonl"; done
done

say "scale: N live blocks"
for n in "${scale_sizes[@]}"; do
  for order in random forward reverse; do
    f="$out/scale-$n-$order.jsonl.gz"
    "$cachealloc" generate scale --blocks "$n" --order "$order" "$f" >/dev/null
    for _ in $(seq "$runs"); do
      "$cachealloc" replay --json "$f" | python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); d["blocks"]=int(sys.argv[1]); d["order"]=sys.argv[2]; print(json.dumps(d))' "$n" "$order" >>"$out/scale.jsonl"
    done
    rm -f "$f"
  done
done

if [ -n "${CACHEALLOC_TORCH_PYTHON:-}" ]; then
  say "the C++ allocator for torch: a pair through CUDAAllocator ($CACHEALLOC_TORCH_PYTHON)"
  (cd python && CACHEALLOC_LIB="$target/release/libcachealloc.so" "$CACHEALLOC_TORCH_PYTHON" -c \
    "import torch, subprocess, sys, cachealloc.native as n; subprocess.run(n.command(torch, sys.argv[1], 'tests/native_bench.cpp', executable=True), check=True); print(torch.__version__)" \
    "$out/native_bench" >"$out/native_torch.txt")
  CACHEALLOC_BACKEND=mock LD_LIBRARY_PATH="$target/release" "$out/native_bench" >"$out/native_bench.txt"
fi

say "heap allocations per operation"
cargo test -q --release -p cachealloc-tests --test no_heap -- --nocapture >"$out/no_heap.txt" 2>&1

say "done; the tables"
python3 scripts/bench_report.py "$out" "$target/criterion"
say "finished"

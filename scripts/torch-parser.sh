#!/usr/bin/env bash
# torch's own settings parser per release, as the reference for cachealloc's:
# builds scripts/torch_parser/probe.cpp against each release's wheel (the
# venvs of scripts/torch-versions.sh; no GPU needed) and writes what it made
# of every string of tests/data/torch_parser/strings.txt to
# tests/data/torch_parser/torch-<release>.jsonl, which the differential test
# (tests/tests/integration/torch_parser.rs) compares with cachealloc's
# parser. Not part of .ci/run: CI reads the checked-in answers.
#
#   scripts/torch-parser.sh                 # every release whose venv exists
#   scripts/torch-parser.sh 2.13.0          # just this one
#   TORCH_VENVS=/elsewhere scripts/torch-parser.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENVS="${TORCH_VENVS:-$HOME/.cache/cachealloc-torch-venvs}"
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(2.11.0 2.12.1 2.13.0 2.14.1 2.15.0)
out=tests/data/torch_parser
build=${CARGO_TARGET_DIR:-target}/torch-parser
mkdir -p "$build"
for v in "${VERSIONS[@]}"; do
  site=$(echo "$VENVS/torch-$v"/lib/python3*/site-packages)
  if [ ! -d "$site/torch/include/c10" ]; then
    echo "== torch $v: no venv at $VENVS/torch-$v (scripts/torch-versions.sh --setup-only $v)"; continue
  fi
  minor=$(echo "$v" | cut -d. -f2)
  # CUDA's headers, which c10's CUDA headers include: the wheel's triton has them.
  cuda_inc=$(dirname "$(find "$site" -path '*crt/host_config.h' | head -1)")/..
  cudart=$(dirname "$(find "$site/nvidia" -name 'libcudart.so*' | head -1)")
  probe="$build/probe-$v"
  g++ -std=c++17 -O1 -w -DTORCH_MINOR="$minor" -I"$site/torch/include" -I"$cuda_inc" \
    scripts/torch_parser/probe.cpp -o "$probe" -L"$site/torch/lib" -lc10 -lc10_cuda \
    -Wl,-rpath,"$site/torch/lib" -Wl,-rpath,"$cudart"
  env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_HIP_ALLOC_CONF -u PYTORCH_ALLOC_CONF \
    "$probe" < "$out/strings.txt" > "$out/torch-${v%.*}.jsonl"
  echo "== torch $v: $(grep -c '"ok":true' "$out/torch-${v%.*}.jsonl") accepted, $(grep -c '"ok":false' "$out/torch-${v%.*}.jsonl") refused -> $out/torch-${v%.*}.jsonl"
done

#!/usr/bin/env bash
# Runs python/tests/test_native.py (the native C++ allocator, on the simulated
# device) against each released torch, one venv each with the CUDA wheel from
# the package index. Not part of .ci/run: a first run downloads a torch wheel
# for each venv (several GB each).
#
#   scripts/torch-versions.sh                 # every version below
#   scripts/torch-versions.sh 2.13.0 2.15.0   # just these
#   TORCH_VENVS=/elsewhere scripts/torch-versions.sh   # where the venvs live
#   scripts/torch-versions.sh --setup-only    # create the venvs, run nothing
set -euo pipefail
cd "$(dirname "$0")/.."
VENVS="${TORCH_VENVS:-$HOME/.cache/cachealloc-torch-venvs}"
SETUP_ONLY=0
VERSIONS=()
for a in "$@"; do
  case "$a" in
    --setup-only) SETUP_ONLY=1 ;;
    *) VERSIONS+=("$a") ;;
  esac
done
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(2.11.0 2.12.1 2.13.0 2.14.1 2.15.0)

cargo build --release -p cachealloc-capi >/dev/null
failed=()
for v in "${VERSIONS[@]}"; do
  venv="$VENVS/torch-$v"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "== creating $venv (torch $v)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "torch==$v"
  fi
  [ "$SETUP_ONLY" = 1 ] && continue
  echo "== torch $v"
  if "$venv/bin/python" -m unittest python/tests/test_native.py -v; then
    echo "== torch $v: passed"
  else
    echo "== torch $v: FAILED"; failed+=("$v")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then echo "failed: ${failed[*]}"; exit 1; fi

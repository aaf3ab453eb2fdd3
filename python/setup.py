"""Builds the cachealloc wheel: pure Python (ctypes) plus libcachealloc.so.

The library is `$CACHEALLOC_LIB` when set (an already built
libcachealloc.so), else built here with `cargo build --release -p
cachealloc-capi` from the repository root (`$CACHEALLOC_CARGO_FEATURES`,
e.g. `debug-hooks`, adds cargo features; the default library has the
CUDA, HIP and simulated backends). It is copied into the package, its debug
info stripped when `strip` is here (`CACHEALLOC_STRIP=0` keeps it), and the
wheel is tagged for this platform (py3-none-linux_x86_64): the code is pure
Python, the library is not. `auditwheel repair` then makes it the
manylinux wheel to publish (python/ci-check.sh does, and installs that):
the library links only libc and libgcc_s, so the tag is manylinux_2_N for
the newest glibc symbol the build machine's libc gave it (2.34 on Debian
13; build inside a manylinux container for an older N).
"""

import json
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LIBRARY = "libcachealloc.so"


def cargo_version():
    """The workspace's version ([workspace.package] of the root Cargo.toml)."""
    try:
        with open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return "0.1.0"
    m = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', text, re.M | re.S)
    return m.group(1) if m else "0.1.0"


def built_library():
    """The path of the libcachealloc.so to ship."""
    given = os.environ.get("CACHEALLOC_LIB")
    if given:
        if not os.path.isfile(given):
            sys.exit("CACHEALLOC_LIB=%s: no such file" % given)
        return os.path.abspath(given)
    if not os.path.isfile(os.path.join(ROOT, "capi", "Cargo.toml")):
        sys.exit(
            "cachealloc: not building inside the cachealloc repository (no %s): set "
            "CACHEALLOC_LIB to a built libcachealloc.so" % os.path.join(ROOT, "capi", "Cargo.toml")
        )
    cmd = ["cargo", "build", "--release", "-p", "cachealloc-capi", "--message-format=json-render-diagnostics"]
    features = os.environ.get("CACHEALLOC_CARGO_FEATURES", "").strip()
    if features:
        cmd += ["--features", features]
    print("cachealloc: " + " ".join(cmd), flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, universal_newlines=True)
    except FileNotFoundError:
        sys.exit("cachealloc: cargo not found: install Rust (rustup.rs), or set CACHEALLOC_LIB")
    if proc.returncode != 0:
        sys.exit("cachealloc: cargo build failed (exit %d)" % proc.returncode)
    found = None
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "cachealloc":
            for path in msg.get("filenames", []):
                if os.path.basename(path) == LIBRARY:
                    found = path
    if not found or not os.path.isfile(found):
        sys.exit("cachealloc: cargo built no %s" % LIBRARY)
    return found


class BuildPy(build_py):
    """build_py, then the library into the package."""

    def run(self):
        super().run()
        # The C header, for the native allocator's build (cachealloc/native.py).
        source = os.path.join(ROOT, "capi", "include", "cachealloc.h")
        if os.path.isfile(source):
            header = os.path.join(self.build_lib, "cachealloc", "include", "cachealloc.h")
            self.mkpath(os.path.dirname(header))
            shutil.copyfile(source, header)
        dst = os.path.join(self.build_lib, "cachealloc", LIBRARY)
        self.mkpath(os.path.dirname(dst))
        shutil.copyfile(built_library(), dst)
        os.chmod(dst, 0o755)
        if os.environ.get("CACHEALLOC_STRIP", "1") != "0" and shutil.which("strip"):
            subprocess.call(["strip", "--strip-debug", dst])

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [
            os.path.join(self.build_lib, "cachealloc", LIBRARY),
            os.path.join(self.build_lib, "cachealloc", "include", "cachealloc.h"),
        ]


class BinaryDistribution(Distribution):
    """Not pure: the wheel carries a native library."""

    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    """Tag py3-none-PLATFORM: any CPython 3 on this platform (ctypes, no
    extension module), not just the building interpreter's version."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    version=cargo_version(),
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel},
)

"""The native path: ``native/allocator.cpp``, a C++ implementation of torch's
``c10::cuda::CUDACachingAllocator::CUDAAllocator`` over libcachealloc,
compiled against the torch this process runs (torch's C++ interface changes
between versions) and cached per torch version.

``build()`` compiles it once (a plain compiler call: no Python headers, no
ninja) into ``$CACHEALLOC_CACHE`` (default ``~/.cache/cachealloc``), under a
name that carries the torch version, its CUDA version and C++ ABI, and a
hash of the sources, of the path of the library it links (dynamically: a
rebuilt library at the same path needs no new build) and of torch's path; ``load()`` loads it into
the process. Nothing here runs at ``import cachealloc``.

What a build needs: a C++ compiler (``$CXX``, else ``c++`` / ``g++`` /
``clang++``) with C++17, or C++20 for torch 2.12 and later (``cxx_standard``), torch's headers and libraries (in the torch wheel), and the
CUDA runtime's headers and library (the ``nvidia-cuda-runtime`` wheel torch
depends on, ``$CUDA_HOME`` or ``/usr/local/cuda``).
"""

import ctypes
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from . import _lib

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "native", "allocator.cpp")


class BuildError(RuntimeError):
    """The native allocator could not be built; the message says why."""


def compiler():
    """The C++ compiler to use, or None."""
    given = os.environ.get("CXX")
    if given:
        return shutil.which(given) or (given if os.path.isfile(given) else None)
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def header_dir():
    """The folder holding cachealloc.h: the wheel's copy, else the source
    checkout's ``capi/include``."""
    for d in (os.path.join(HERE, "include"), os.path.join(os.path.dirname(os.path.dirname(HERE)), "capi", "include")):
        if os.path.isfile(os.path.join(d, "cachealloc.h")):
            return d
    raise BuildError("cachealloc.h not found (neither in the package nor in a source checkout)")


def _site_roots(torch):
    """Folders that may hold the nvidia-* wheels: torch's site-packages."""
    return [os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))]


def cuda_paths(torch):
    """(include folder, a folder for crt/host_config.h when the first lacks
    it (or None), folder of libcudart, its file name) of the CUDA runtime
    torch uses."""
    roots = []
    for site in _site_roots(torch):
        roots += sorted(glob.glob(os.path.join(site, "nvidia", "*")))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            roots.append(os.environ[env])
    try:
        from torch.utils import cpp_extension  # noqa: F401

        if getattr(cpp_extension, "CUDA_HOME", None):
            roots.append(cpp_extension.CUDA_HOME)
    except Exception:  # noqa: BLE001 - cpp_extension is optional here
        pass
    roots.append("/usr/local/cuda")
    major = (getattr(torch.version, "cuda", None) or "").split(".")[0]
    include = libdir = libname = None
    for root in roots:
        if include is None and os.path.isfile(os.path.join(root, "include", "cuda_runtime_api.h")):
            include = os.path.join(root, "include")
        if libdir is None:
            for sub in ("lib", "lib64"):
                libs = sorted(glob.glob(os.path.join(root, sub, "libcudart.so*")))
                # The runtime of torch's CUDA major version first.
                libs.sort(key=lambda p: (not os.path.basename(p).startswith("libcudart.so." + major), len(p)))
                if libs:
                    libdir, libname = os.path.join(root, sub), os.path.basename(libs[0])
                    break
    if include is None:
        raise BuildError(
            "the CUDA runtime's headers (cuda_runtime_api.h) were not found in the nvidia-* wheels "
            "beside torch, $CUDA_HOME or /usr/local/cuda"
        )
    # cuda_runtime.h includes crt/host_config.h, which the nvidia-cuda-runtime
    # wheel lacks (the compiler's wheel has it; so does triton's copy).
    crt = None
    if not os.path.isfile(os.path.join(include, "crt", "host_config.h")):
        extra = [os.path.join(r, "include") for r in roots]
        for site in _site_roots(torch):
            extra.append(os.path.join(site, "triton", "backends", "nvidia", "include"))
        crt = next((d for d in extra if os.path.isfile(os.path.join(d, "crt", "host_config.h"))), None)
        if crt is None:
            raise BuildError(
                "the CUDA headers beside torch lack crt/host_config.h: install the CUDA toolkit "
                "(set CUDA_HOME) or `pip install nvidia-cuda-nvcc`"
            )
    if libdir is None:
        raise BuildError("the CUDA runtime library (libcudart.so) was not found beside torch or in $CUDA_HOME")
    return include, crt, libdir, libname


def cache_dir():
    """Where built libraries are kept."""
    given = os.environ.get("CACHEALLOC_CACHE")
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cachealloc")


def _fingerprint(parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


#: Parts of torch's allocator interface that came with a torch version:
#: (header, name, the macro allocator.cpp guards the part with), set from
#: the installed header.
HEADER_FEATURES = [
    ("c10/cuda/CUDACachingAllocator.h", "attachOomRejectionObserver", "CACHEALLOC_TORCH_OOM_REJECTION"),
    ("c10/core/CachingDeviceAllocator.h", "num_oom_rejections", "CACHEALLOC_TORCH_OOM_REJECTION_STAT"),
    ("c10/core/CachingDeviceAllocator.h", "reserved_bytes_by_private_pools",
     "CACHEALLOC_TORCH_POOL_RESERVED_STATS"),
    ("c10/cuda/CUDACachingAllocator.h", "allocateWithAddress",
     "CACHEALLOC_TORCH_ALLOCATE_WITH_ADDRESS"),
    ("c10/cuda/CUDACachingAllocator.h", "markCaptureBegin", "CACHEALLOC_TORCH_MARK_CAPTURE"),
]


def features(torch):
    """``-D`` flags saying which of ``HEADER_FEATURES`` the installed
    torch's headers declare (none for a header that cannot be read: the
    version macros decide)."""
    include = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "include")
    flags = []
    for header, name, macro in HEADER_FEATURES:
        try:
            with open(os.path.join(include, header), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        flags.append("-D%s=%d" % (macro, int(name in text)))
    return flags


def cxx_standard(torch):
    """C++20 from torch 2.12 on (its headers use std::bit_width and
    std::strong_ordering), C++17 before."""
    try:
        major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return "-std=c++20"
    return "-std=c++20" if (major, minor) >= (2, 12) else "-std=c++17"


def cxx11_abi(torch):
    """torch's ``_GLIBCXX_USE_CXX11_ABI`` (1 where it does not say)."""
    return int(bool(getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", True)))


def _toolchain(torch):
    """(the C++ compiler, torch's folder, its ``lib`` folder, the folder of
    libcachealloc) of a build against ``torch``. Raises BuildError without
    a compiler."""
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler (set CXX, or install g++ or clang++)")
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    return cxx, torch_dir, os.path.join(torch_dir, "lib"), os.path.dirname(_lib.library_path())


def command(torch, out, source=SOURCE, executable=False):
    """The compiler call that builds the library at ``out`` (or, with
    ``executable``, a program from ``source``, which includes the
    allocator's source: the tests' driver)."""
    cxx, torch_dir, torch_lib, libdir = _toolchain(torch)
    include, crt, cudart_dir, cudart = cuda_paths(torch)
    return [
        cxx,
        cxx_standard(torch),
        "-O2",
        "-Wall",
    ] + ([] if executable else ["-fPIC", "-shared", "-fvisibility=hidden"]) + [
        "-D_GLIBCXX_USE_CXX11_ABI=%d" % cxx11_abi(torch),
    ] + features(torch) + [
        "-I", os.path.join(torch_dir, "include"),
        "-I", os.path.join(torch_dir, "include", "torch", "csrc", "api", "include"),
        "-I", include,
    ] + (["-idirafter", crt] if crt else []) + [
        "-I", header_dir(),
        source,
        "-o", out,
        "-L", torch_lib,
        "-L", libdir,
        "-L", cudart_dir,
        "-Wl,-rpath," + ":".join([torch_lib, libdir, cudart_dir]),
        "-lc10",
        "-lc10_cuda",
        "-ltorch_cuda",
        "-lcachealloc",
        "-l:" + cudart,
    ]


def build(verbose=False):
    """The path of the native allocator library for the torch imported in
    this process, compiled now if the cache has none. Raises BuildError."""
    import torch

    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if not cuda:
        raise BuildError("torch %s is not a CUDA build" % getattr(torch, "__version__", "(unknown)"))
    source = b""
    for name in sorted(os.listdir(os.path.dirname(SOURCE))):  # allocator.cpp and its headers
        if name.endswith((".cpp", ".h")):
            with open(os.path.join(os.path.dirname(SOURCE), name), "rb") as f:
                source += name.encode() + b"\0" + f.read()
    with open(os.path.join(header_dir(), "cachealloc.h"), "rb") as f:
        header = f.read()
    library = _lib.library_path()
    key = _fingerprint([source, header, library, sys.platform, torch.__file__])
    name = "cachealloc_torch-%s-cu%s-abi%d-%s.so" % (
        torch.__version__.replace("+", "_"), torch.version.cuda, cxx11_abi(torch), key)
    return _compile_cached(name, lambda out: command(torch, out), verbose,
                           "the native allocator against torch %s" % torch.__version__)


def _compile_cached(name, command_for, verbose, what):
    """The library ``name`` in the cache folder, compiled now by the
    command ``command_for(path)`` if the cache has none. Raises BuildError
    (``what`` names it)."""
    folder = cache_dir()
    path = os.path.join(folder, name)
    if os.path.isfile(path):
        return path
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
        os.close(fd)
    except OSError as e:
        raise BuildError("cannot write to the cache folder %s (%s); set CACHEALLOC_CACHE" % (folder, e)) from e
    try:
        cmd = command_for(tmp)
        if verbose:
            print("cachealloc: " + " ".join(cmd), file=sys.stderr)
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        except OSError as e:
            raise BuildError("running the compiler %s failed: %s" % (cmd[0], e)) from e
        if proc.returncode != 0:
            raise BuildError("compiling %s failed (exit %d):\n%s" % (what, proc.returncode, proc.stdout[-4000:]))
        os.replace(tmp, path)  # atomic: another process may build the same
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


#: The pluggable path's allocation entry (``native/pluggable.cpp``).
PLUGGABLE_SOURCE = os.path.join(HERE, "native", "pluggable.cpp")


def pluggable_command(torch, out):
    """The compiler call that builds the pluggable path's entry at ``out``:
    c10's headers and libc10 only, so any torch build (CUDA or ROCm)
    serves."""
    cxx, torch_dir, torch_lib, libdir = _toolchain(torch)
    include = os.path.join(torch_dir, "include")
    if not os.path.isfile(os.path.join(include, "c10", "util", "Exception.h")):
        raise BuildError("torch's C++ headers (c10/util/Exception.h) are not in %s" % include)
    return [cxx, cxx_standard(torch), "-O2", "-Wall", "-fPIC", "-shared", "-fvisibility=hidden",
            "-D_GLIBCXX_USE_CXX11_ABI=%d" % cxx11_abi(torch), "-I", include, "-I", header_dir(),
            PLUGGABLE_SOURCE, "-o", out, "-L", torch_lib, "-L", libdir,
            "-Wl,-rpath," + ":".join([torch_lib, libdir]), "-lc10", "-lcachealloc"]


def build_pluggable(verbose=False):
    """The path of the pluggable path's allocation entry for the torch
    imported in this process (``cachealloc_torch_pluggable_alloc`` /
    ``_free``, which raise c10::OutOfMemoryError), compiled now if the
    cache has none. Raises BuildError."""
    import torch

    if not getattr(torch, "__file__", None):
        raise BuildError("this torch module has no __file__: its C++ headers cannot be found")
    with open(PLUGGABLE_SOURCE, "rb") as f:
        source = f.read()
    with open(os.path.join(header_dir(), "cachealloc.h"), "rb") as f:
        header = f.read()
    library = _lib.library_path()
    key = _fingerprint([source, header, library, sys.platform, torch.__file__])
    name = "cachealloc_pluggable-%s-%s.so" % (str(getattr(torch, "__version__", "unknown")).replace("+", "_"), key)
    return _compile_cached(name, lambda out: pluggable_command(torch, out), verbose,
                           "the pluggable allocation entry against torch %s" % getattr(torch, "__version__", "?"))


_LOADED = None


def load(verbose=False):
    """The native allocator library, built if needed and loaded (torch's
    libraries are loaded first, by ``import torch``)."""
    global _LOADED
    if _LOADED is None:
        import torch  # noqa: F401 - loads libc10, libtorch_cuda

        path = build(verbose)
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:  # built, but this torch's libraries do not match it
            raise BuildError("loading %s failed: %s" % (path, e)) from e
        lib.cachealloc_torch_install.restype = ctypes.c_int
        lib.cachealloc_torch_install.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.cachealloc_torch_allocator.restype = ctypes.c_void_p
        lib.cachealloc_torch_allocator.argtypes = []
        lib.cachealloc_torch_built_against.restype = ctypes.c_char_p
        lib.cachealloc_torch_built_against.argtypes = []
        _LOADED = lib
    return _LOADED


def install(verbose=False):
    """Build, load and make the native allocator torch's CUDA allocator.
    Raises BuildError (it could not be built) or RuntimeError (torch
    refused it)."""
    lib = load(verbose)
    err = ctypes.create_string_buffer(4096)
    if lib.cachealloc_torch_install(err, len(err)) != 0:
        raise RuntimeError("cachealloc: torch refused the native allocator: " + err.value.decode("utf-8", "replace"))
    import torch

    from .torch_glue import follow_torch_settings

    follow_torch_settings(torch)
    return lib

"""``install()``: make libcachealloc PyTorch's CUDA allocator: natively (a
C++ ``CUDAAllocator`` built against the installed torch, ``native.py``), or
through ``torch.cuda.memory.CUDAPluggableAllocator`` and its optional hooks
(the fallback without a C++ compiler, or ``install(native=False)``)."""

import os
import threading
import warnings

from . import _lib

#: PyTorch's hook setters on ``CUDAPluggableAllocator(...).allocator()`` and
#: the C function each is given (each set only if the installed torch has it).
HOOKS = [
    ("set_init_fn", "cachealloc_init"),
    ("set_reset_fn", "cachealloc_reset"),
    ("set_memory_fraction_fn", "cachealloc_set_memory_fraction"),
    ("set_base_alloc_fn", "cachealloc_base_alloc"),
    ("set_record_stream_fn", "cachealloc_record_stream"),
    ("set_begin_allocate_to_pool", "cachealloc_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "cachealloc_end_allocate_to_pool"),
    ("set_release_pool", "cachealloc_release_pool"),
]

#: What torch loses on the pluggable path (the warning of the fallback).
PLUGGABLE_LOSES = (
    "torch's own torch.cuda.memory_stats(), memory_summary(), max_memory_allocated() and "
    "reset_peak_memory_stats() raise (use cachealloc's functions of the same names); "
    "torch.cuda.memory._record_memory_history(), _snapshot() and _dump_snapshot() raise (use "
    "cachealloc.record_history() and cachealloc.snapshot()); cuDNN's benchmark mode "
    "(torch.backends.cudnn.benchmark = True) fails in cacheInfo; a CUDA graph's pool takes every "
    "stream of its device, not only the capturing ones; torch.multiprocessing cannot send CUDA "
    "tensors"
)

#: What the pluggable path loses besides, where its raising allocation
#: entry (native/pluggable.cpp) could not be built.
ABORTS_ON_OOM = (
    "an out-of-memory aborts the process with PyTorch's message instead of raising "
    "torch.OutOfMemoryError, because the entry that raises it (cachealloc/native/pluggable.cpp, "
    "which needs a C++ compiler and torch's c10 headers) could not be built: %s"
)

_LOCK = threading.Lock()
_INSTALLED = None  # what install() returned, kept for the process's life
_MODE = None  # "native" or "pluggable"


#: torch's setters of a later settings string (``_set_allocator_settings``
#: and the accelerator's, which the first calls from torch 2.9 on): each is
#: wrapped by ``follow_torch_settings`` where the installed torch has it.
SETTINGS_SETTERS = ("_accelerator_setAllocatorSettings", "_cuda_cudaCachingAllocator_set_allocator_settings")


def follow_torch_settings(torch):
    """Make torch's run-time settings reach cachealloc: after torch's own
    parser accepted a string given to ``torch.cuda.memory._set_allocator_settings``
    (or ``torch._C._accelerator_setAllocatorSettings``), the same string is
    applied to cachealloc with the selected release's later-string rules
    (``cachealloc.set_allocator_settings``). A string torch refuses raises
    as before and changes nothing. Idempotent."""
    from .stats import set_allocator_settings

    c = getattr(torch, "_C", None)
    for name in SETTINGS_SETTERS:
        torchs = getattr(c, name, None)
        if torchs is None or getattr(torchs, "_cachealloc_follows", False):
            continue

        def setter(env, _torchs=torchs):
            result = _torchs(env)
            set_allocator_settings(env)
            return result

        setter._cachealloc_follows = True
        setter.__name__ = name
        setter.__doc__ = getattr(torchs, "__doc__", None)
        setattr(c, name, setter)


def _pluggable_entry(verbose):
    """(library, alloc name, free name) for CUDAPluggableAllocator: the
    entry that raises torch.OutOfMemoryError (built against this torch's
    c10), else the library's own, which aborts on a failure (saying why,
    as a RuntimeWarning)."""
    from . import native as _native

    try:
        path = _native.build_pluggable(verbose)
    except _native.BuildError as e:
        warnings.warn("cachealloc.install(): on torch's pluggable allocator interface " + ABORTS_ON_OOM % (e,),
                      RuntimeWarning, stacklevel=3)
        return _lib.library_path(), "cachealloc_pluggable_alloc", "cachealloc_free"
    return path, "cachealloc_torch_pluggable_alloc", "cachealloc_torch_pluggable_free"


def _torch():
    try:
        import torch  # noqa: F401
        import torch.cuda.memory  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "cachealloc.install() needs PyTorch (the `torch` package), which could not be "
            "imported (%s). Install torch with CUDA support, or use cachealloc's own "
            "functions without torch." % (e,)
        ) from e
    return torch


def installed():
    """Whether ``install()`` made cachealloc torch's CUDA allocator."""
    return _INSTALLED is not None


def install_mode():
    """How ``install()`` installed cachealloc: ``"native"`` (torch's own
    memory API works), ``"pluggable"``, or None (not installed)."""
    return _MODE


def install(native=True, verbose=False):
    """Make cachealloc PyTorch's CUDA allocator for this process. Call it
    before anything uses CUDA (the first CUDA tensor, ``torch.cuda.init()``,
    ...): PyTorch cannot swap an allocator in use. A second call returns
    what the first did.

    Natively (the default): ``native/allocator.cpp``, a C++ implementation
    of torch's ``CUDAAllocator`` over libcachealloc, is compiled against the
    installed torch the first time (some seconds; cached per torch version
    in ``$CACHEALLOC_CACHE``, default ``~/.cache/cachealloc``) and becomes
    torch's allocator: torch's own ``torch.cuda.memory_stats()``,
    ``memory_summary()``, ``_record_memory_history()`` / ``_snapshot()`` /
    ``_dump_snapshot()``, ``torch.OutOfMemoryError``, cuDNN's benchmark
    mode, CUDA graphs and ``torch.multiprocessing`` work as with torch's
    own allocator. Returns ``torch.cuda.memory._get_current_allocator()``.
    ``verbose`` prints the compiler call.

    When it cannot be built (no C++ compiler, no CUDA headers), on a ROCm
    build of torch, or with ``native=False``, the pluggable path:
    ``CUDAPluggableAllocator`` with every hook the installed torch has
    (``HOOKS``), returned; the fallback warns (RuntimeWarning) with what it
    loses (``PLUGGABLE_LOSES``). Its allocation raises
    ``torch.OutOfMemoryError`` through a small entry compiled against
    torch's c10 headers (``native/pluggable.cpp``); where that cannot be
    built either, an out-of-memory aborts the process, and ``install()``
    says so (RuntimeWarning).

    Raises ImportError without torch, and RuntimeError when CUDA is not
    available, already initialised, the library's settings are wrong, or
    ``CACHEALLOC_BACKEND=mock`` (its addresses are not real memory)."""
    global _INSTALLED, _MODE
    with _LOCK:
        if _INSTALLED is not None:
            return _INSTALLED
        torch = _torch()
        if not torch.cuda.is_available():
            raise RuntimeError(
                "cachealloc.install(): torch.cuda.is_available() is False (no GPU, no driver, or a "
                "CPU-only torch build): there is no CUDA allocator to replace. cachealloc's own "
                "functions still work on the simulated device (CACHEALLOC_BACKEND=mock)."
            )
        # A ROCm build of torch (torch.version.hip set) runs on HIP: the
        # library takes the HIP backend and torch's ROCm settings variables.
        hip = getattr(getattr(torch, "version", None), "hip", None)
        wanted = "hip" if hip else "cuda"
        backend = os.environ.get("CACHEALLOC_BACKEND", "").strip().lower()
        if backend == "mock":
            raise RuntimeError(
                "cachealloc.install(): CACHEALLOC_BACKEND=mock hands out simulated addresses, "
                "which torch's kernels cannot use; unset it (or set %s) to install." % wanted
            )
        if backend in ("cuda", "hip") and backend != wanted:
            raise RuntimeError(
                "cachealloc.install(): this torch is a %s build%s, but CACHEALLOC_BACKEND=%s; "
                "unset it (or set %s)." % ("ROCm" if hip else "CUDA", " (HIP %s)" % hip if hip else "",
                                           backend, wanted)
            )
        if backend in ("", "auto"):
            os.environ["CACHEALLOC_BACKEND"] = wanted
        is_initialized = getattr(torch.cuda, "is_initialized", None)
        if is_initialized is not None and is_initialized():
            raise RuntimeError(
                "cachealloc.install() must come before any CUDA use: torch has initialised CUDA "
                "already, and cannot swap an allocator in use. Call it right after `import torch`."
            )
        # The decisions (block order, settings keys, statistics) of the torch
        # in this process, unless the environment names another release.
        version = getattr(torch, "__version__", "")
        if version:
            os.environ.setdefault("CACHEALLOC_TORCH_VERSION", str(version))
        lib = _lib.lib()
        # PyTorch calls init(0) as it creates the allocator, and ignores its
        # errors: check the settings here, with a message.
        lib.cachealloc_init(0)
        _lib.check_void("cachealloc_init (the CACHEALLOC_* settings)")
        running = _lib.backend()
        if running != wanted:
            raise RuntimeError(
                "cachealloc.install(): the library already runs on the %s backend (its settings were "
                "read at an earlier call), but this torch needs %s: call install() before any other "
                "cachealloc function, or set CACHEALLOC_BACKEND=%s." % (running, wanted, wanted)
            )
        if native and hip:
            # The C++ allocator is written against torch's CUDA build only.
            warnings.warn(
                "cachealloc.install(): on a ROCm build of torch (HIP %s) cachealloc installs through "
                "torch's pluggable allocator interface (the native allocator is built for CUDA "
                "builds only), where %s." % (hip, PLUGGABLE_LOSES),
                RuntimeWarning,
                stacklevel=2,
            )
            native = False
        if native:
            from . import native as _native

            try:
                _native.install(verbose)
            except _native.BuildError as e:
                warnings.warn(
                    "cachealloc.install(): the native allocator could not be built (%s); using "
                    "torch's pluggable allocator interface instead, where %s." % (e, PLUGGABLE_LOSES),
                    RuntimeWarning,
                    stacklevel=2,
                )
            else:
                follow_torch_settings(torch)
                _INSTALLED = torch.cuda.memory._get_current_allocator()
                _MODE = "native"
                return _INSTALLED
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(*_pluggable_entry(verbose))
        inner = pluggable.allocator()
        for setter, c_name in HOOKS:
            set_hook = getattr(inner, setter, None)
            if set_hook is not None:
                set_hook(_lib.address(c_name))
        torch.cuda.memory.change_current_allocator(pluggable)
        follow_torch_settings(torch)
        _INSTALLED = pluggable
        _MODE = "pluggable"
        return pluggable

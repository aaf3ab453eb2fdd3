"""``install()``: make libcachealloc PyTorch's CUDA allocator, through
``torch.cuda.memory.CUDAPluggableAllocator`` and its optional hooks."""

import os
import threading

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

_LOCK = threading.Lock()
_INSTALLED = None  # the CUDAPluggableAllocator, kept for the process's life


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


def install():
    """Make cachealloc PyTorch's CUDA allocator for this process. Call it
    before anything uses CUDA (the first CUDA tensor, ``torch.cuda.init()``,
    ...): PyTorch cannot swap an allocator in use. Returns the
    ``torch.cuda.memory.CUDAPluggableAllocator``; a second call returns the
    same one.

    Steps: ``CUDAPluggableAllocator(library_path(), "cachealloc_alloc",
    "cachealloc_free")``; every hook setter the installed torch has on its
    ``.allocator()`` is given the matching C function's address (see
    ``HOOKS``); then ``torch.cuda.memory.change_current_allocator``.

    Raises ImportError without torch, and RuntimeError when CUDA is not
    available, already initialised, the library's settings are wrong, or
    ``CACHEALLOC_BACKEND=mock`` (its addresses are not real memory)."""
    global _INSTALLED
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
        backend = os.environ.get("CACHEALLOC_BACKEND", "").strip().lower()
        if backend == "mock":
            raise RuntimeError(
                "cachealloc.install(): CACHEALLOC_BACKEND=mock hands out simulated addresses, "
                "which torch's kernels cannot use; unset it (or set cuda / hip) to install."
            )
        is_initialized = getattr(torch.cuda, "is_initialized", None)
        if is_initialized is not None and is_initialized():
            raise RuntimeError(
                "cachealloc.install() must come before any CUDA use: torch has initialised CUDA "
                "already, and cannot swap an allocator in use. Call it right after `import torch`."
            )
        lib = _lib.lib()
        # PyTorch calls init(0) as it creates the allocator, and ignores its
        # errors: check the settings here, with a message.
        lib.cachealloc_init(0)
        _lib.check_void("cachealloc_init (the CACHEALLOC_* settings)")
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(
            _lib.library_path(), "cachealloc_alloc", "cachealloc_free"
        )
        inner = pluggable.allocator()
        for setter, c_name in HOOKS:
            set_hook = getattr(inner, setter, None)
            if set_hook is not None:
                set_hook(_lib.address(c_name))
        torch.cuda.memory.change_current_allocator(pluggable)
        _INSTALLED = pluggable
        return pluggable

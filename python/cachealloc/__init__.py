"""cachealloc: PyTorch's CUDA caching allocator (a Rust port), as a
pluggable allocator for torch and as a library of its own.

    import torch, cachealloc
    cachealloc.install()            # before any CUDA use
    ...                             # train as usual
    print(cachealloc.memory_summary())
    cachealloc.snapshot("snap.pickle")   # for pytorch.org/memory_viz

``install()`` builds a C++ allocator against the installed torch (once,
cached) and makes it torch's own: torch's ``torch.cuda.memory_stats``,
``memory_summary``, ``_record_memory_history``, ``_dump_snapshot`` and
``torch.OutOfMemoryError`` then work as with torch's allocator. Without a
CUDA build to compile against (a ROCm torch, or ``install(native=False)``)
it falls back to torch's pluggable interface, where torch's own functions
raise; an out-of-memory still raises ``torch.OutOfMemoryError`` there
(through a small entry built against torch's c10 headers), and aborts the
process with PyTorch's message only where no C++ compiler is present.
This package has torch's functions under the same names, with the same
keys and values, on either path
(``memory_stats``, ``memory_allocated``, ``max_memory_allocated``,
``memory_reserved``, ``max_memory_reserved``, ``reset_peak_memory_stats``,
``reset_accumulated_memory_stats``, ``memory_summary``, ``empty_cache``,
``set_per_process_memory_fraction``, ``get_per_process_memory_fraction``,
``caching_allocator_alloc`` /
``caching_allocator_delete``), plus ``record_history``,
``record_annotation``, ``snapshot``, ``cache_info`` and
``attach_oom_observer``; and cachealloc's own accounting: why the last
out-of-memory happened (``last_oom_cause``, ``attach_oom_cause_observer``;
the exception's message ends with it) and where the reserved memory is
(``memory_fragmentation``, ``pool_memory``). ``import cachealloc`` never needs torch; only
``install()`` does.

The library (``libcachealloc.so``, shipped inside the wheel; see
``library_path()``) reads its settings from the environment once, at its
first call, so set them before:

CACHEALLOC_BACKEND
    ``cuda``, ``hip``, ``mock`` (a simulated device, for trying the API
    without a GPU; ``install()`` refuses it: its addresses are not real
    memory), or ``auto`` (the default): the GPU that is present, CUDA's
    first (``backend()`` says which). ``install()`` sets it from the torch
    build: ``hip`` for a ROCm build (``torch.version.hip``), else ``cuda``.
CACHEALLOC_CONF
    the allocator's settings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax, e.g.
    ``max_split_size_mb:128,expandable_segments:True`` (default: torch's
    variables in torch's order, ``PYTORCH_CUDA_ALLOC_CONF``, on HIP
    ``PYTORCH_HIP_ALLOC_CONF``, then ``PYTORCH_ALLOC_CONF``).
CACHEALLOC_MOCK_CAPACITY
    the simulated device's size, in bytes or with a unit (``4GiB``);
    unlimited by default.
CACHEALLOC_SLOTS
    block slots a device starts with (88 bytes of host memory each, doubled
    whenever they run out; default 65536).
CACHEALLOC_HISTORY_CAPACITY
    most memory-history entries kept per device (default 131072).
CACHEALLOC_LIB
    where to find libcachealloc.so when this package has no bundled copy
    (a source checkout); also read by the wheel build.

Failures of the library raise ``CacheallocError`` (a RuntimeError) with
the library's message (``cachealloc_last_error()``); an allocation that
finds no room raises its subclass ``OutOfMemoryError`` (the library's
``CACHEALLOC_ERROR_OUT_OF_MEMORY``, PyTorch's "CUDA out of memory").
"""

from ._lib import CacheallocError, OutOfMemoryError, backend, library_path, version
from .stats import (
    CacheInfo,
    attach_oom_cause_observer,
    attach_oom_observer,
    attach_oom_rejection_observer,
    cache_info,
    caching_allocator_alloc,
    caching_allocator_delete,
    empty_cache,
    last_oom_cause,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_fragmentation,
    memory_stats,
    memory_summary,
    pool_memory,
    record_annotation,
    record_history,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    get_per_process_memory_fraction,
    set_allocator_settings,
    set_per_process_memory_fraction,
    snapshot,
)
from .torch_glue import install, install_mode, installed

try:
    from importlib.metadata import PackageNotFoundError, version as _dist_version

    try:
        __version__ = _dist_version("cachealloc")
    except PackageNotFoundError:
        __version__ = "0+unknown"
except ImportError:  # Python < 3.8
    __version__ = "0+unknown"

__all__ = [
    "CacheInfo",
    "CacheallocError",
    "OutOfMemoryError",
    "attach_oom_cause_observer",
    "backend",
    "attach_oom_observer",
    "attach_oom_rejection_observer",
    "cache_info",
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "empty_cache",
    "get_per_process_memory_fraction",
    "install",
    "install_mode",
    "installed",
    "last_oom_cause",
    "library_path",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_fragmentation",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "pool_memory",
    "record_annotation",
    "record_history",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_allocator_settings",
    "set_per_process_memory_fraction",
    "snapshot",
    "version",
]

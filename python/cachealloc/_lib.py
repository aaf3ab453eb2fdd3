"""Loading libcachealloc.so with ctypes, and the prototype of every function
of its C header (capi/include/cachealloc.h).

The library is looked for, in order:

1. next to this file (the copy a wheel ships);
2. ``$CACHEALLOC_LIB`` (a path to a built ``libcachealloc.so``);
3. ``target/release`` then ``target/debug`` of the source checkout this
   package sits in (``python/cachealloc`` of the cachealloc repository).

Every function of the header is declared below with its C types, so a wrong
call raises ``ctypes.ArgumentError`` instead of corrupting memory.
"""

import ctypes
import os
import threading
from ctypes import POINTER, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint64, c_void_p

LIBRARY_NAME = "libcachealloc.so"

#: ``typedef void (*cachealloc_stat_callback)(const char*, int64_t, void*)``
STAT_CALLBACK = ctypes.CFUNCTYPE(None, c_char_p, c_int64, c_void_p)
#: cachealloc_pool_reserved_stats: pool id, its `cachealloc_stat[3]`, user.
POOL_STATS_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_uint64, c_void_p, c_void_p)

#: ``typedef void (*cachealloc_oom_observer)(int, size_t, size_t, size_t, void*)``
OOM_OBSERVER = ctypes.CFUNCTYPE(None, c_int, c_size_t, c_size_t, c_size_t, c_void_p)



class PoolMemory(ctypes.Structure):
    """``cachealloc_pool_memory``: one pool's memory, or several pools'."""

    _fields_ = [(name, c_uint64) for name in (
        "reserved_bytes", "allocated_bytes", "requested_bytes", "free_bytes", "largest_free_block",
        "free_blocks", "pending_free_bytes", "unmapped_bytes")] + [("external_fragmentation", c_double)]


class Fragmentation(ctypes.Structure):
    """``cachealloc_fragmentation``: a device's memory by pool."""

    _fields_ = [(name, PoolMemory) for name in ("device", "small_pool", "large_pool", "private_pools")] + [
        (name, c_uint64) for name in ("stream", "stream_free_bytes", "other_streams_free_bytes")]


class OomCause(ctypes.Structure):
    """``cachealloc_oom_cause``: why an allocation ran out of memory."""

    _fields_ = [("class_", c_int), ("class_name", c_char_p)] + [(name, c_uint64) for name in (
        "needed", "live_bytes", "limit", "segment", "headroom", "free_bytes", "largest_free_block",
        "pending_free_bytes", "other_streams_bytes", "private_pools_bytes", "other_size_bytes",
        "unmapped_bytes")]


#: ``typedef void (*cachealloc_oom_cause_observer)(int, const cachealloc_oom_cause*, void*)``
OOM_CAUSE_OBSERVER = ctypes.CFUNCTYPE(None, c_int, POINTER(OomCause), c_void_p)


class IpcHandle(ctypes.Structure):
    """``cachealloc_ipc_handle``: the driver's IPC handle of a segment and an
    allocation's offset in it."""

    _fields_ = [("handle", ctypes.c_uint8 * 64), ("offset", c_uint64)]


#: The C library's test hooks: only a library built with the cargo feature
#: ``debug-hooks`` has them (``has_debug_hooks()``).
DEBUG_PROTOTYPES = {
    "cachealloc_debug_force_internal_error": (c_int, []),
    "cachealloc_debug_fail_inside_lock": (c_int, []),
}

#: name: (restype, argtypes), in the header's order.
PROTOTYPES = {
    "cachealloc_version": (c_char_p, []),
    "cachealloc_backend": (c_char_p, []),
    "cachealloc_last_error": (c_char_p, []),
    "cachealloc_last_error_code": (c_int, []),
    "cachealloc_get_fragmentation": (c_int, [c_int, c_void_p, POINTER(Fragmentation)]),
    "cachealloc_get_pool_memory": (c_int, [c_int, c_uint64, c_uint64, c_int, POINTER(PoolMemory)]),
    "cachealloc_last_oom_cause": (c_int, [POINTER(OomCause)]),
    "cachealloc_attach_oom_cause_observer": (c_int, [OOM_CAUSE_OBSERVER, c_void_p]),
    "cachealloc_record_history": (c_int, [c_int, c_int, c_size_t]),
    "cachealloc_record_history_ex": (c_int, [c_int, c_int, c_size_t, c_int, ctypes.c_uint32]),
    "cachealloc_record_annotation": (c_int, [c_int, c_char_p]),
    "cachealloc_attach_oom_observer": (c_int, [OOM_OBSERVER, c_void_p]),
    "cachealloc_attach_oom_rejection_observer": (c_int, [OOM_OBSERVER, c_void_p]),
    # The structures' functions (used by the C++ allocator for torch) take
    # pointers to structures this package does not mirror.
    "cachealloc_attach_trace_tracker": (c_int, [c_void_p, c_void_p]),
    "cachealloc_share_ipc_handle": (c_int, [c_void_p, POINTER(IpcHandle)]),
    "cachealloc_release_ipc_share": (c_int, [c_void_p]),
    "cachealloc_open_ipc_handle": (c_void_p, [POINTER(IpcHandle), c_int]),
    "cachealloc_close_ipc_handle": (c_int, [POINTER(IpcHandle), c_int]),
    "cachealloc_enable_peer_access": (c_int, [c_int, c_int]),
    "cachealloc_memcpy_async": (c_int, [c_void_p, c_int, c_void_p, c_int, c_size_t, c_void_p, c_int]),
    "cachealloc_alloc": (c_void_p, [c_size_t, c_int, c_void_p]),
    "cachealloc_pluggable_alloc": (c_void_p, [c_size_t, c_int, c_void_p]),
    "cachealloc_alloc_aligned": (c_void_p, [c_size_t, c_size_t, c_int, c_void_p]),
    "cachealloc_alloc_at": (c_void_p, [c_size_t, c_int, c_void_p, c_void_p]),
    "cachealloc_share_ipc_pages": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p]),
    "cachealloc_open_ipc_pages": (c_void_p, [c_void_p, c_void_p, c_int]),
    "cachealloc_close_ipc_pages": (c_int, [c_void_p, c_void_p, c_int]),
    "cachealloc_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
    "cachealloc_free_checked": (c_int, [c_void_p, c_size_t, c_int, c_void_p]),
    "cachealloc_init": (None, [c_int]),
    "cachealloc_reset": (None, []),
    "cachealloc_set_memory_fraction": (None, [c_double, c_int]),
    "cachealloc_get_memory_fraction": (c_double, [c_int]),
    "cachealloc_base_alloc": (c_void_p, [c_void_p, POINTER(c_size_t)]),
    "cachealloc_record_stream": (None, [c_void_p, c_void_p]),
    "cachealloc_begin_allocate_to_pool": (None, [c_int, c_uint64, c_uint64, c_void_p]),
    "cachealloc_end_allocate_to_pool": (None, [c_int, c_uint64, c_uint64]),
    "cachealloc_release_pool": (None, [c_int, c_uint64, c_uint64]),
    "cachealloc_snapshot": (c_int, [c_int, c_char_p]),
    "cachealloc_snapshot_walk": (c_int, [c_int, c_int, c_void_p, c_void_p]),
    "cachealloc_get_allocator_settings": (c_int, [c_void_p]),
    "cachealloc_memory_stats": (c_int, [c_int, STAT_CALLBACK, c_void_p]),
    "cachealloc_pool_reserved_stats": (c_int, [c_int, POOL_STATS_CALLBACK, c_void_p]),
    "cachealloc_reset_peak_stats": (c_int, [c_int]),
    "cachealloc_reset_accumulated_stats": (c_int, [c_int]),
    "cachealloc_empty_cache": (c_int, [c_int]),
    "cachealloc_empty_cache_pool": (c_int, [c_int, c_uint64, c_uint64]),
    "cachealloc_mem_get_info": (c_int, [c_int, POINTER(c_size_t), POINTER(c_size_t)]),
    "cachealloc_cache_info": (c_int, [c_int, POINTER(c_size_t), POINTER(c_size_t)]),
    "cachealloc_get_device_stats": (c_int, [c_int, c_void_p]),
    "cachealloc_begin_allocate_to_pool_filtered": (c_int, [c_int, c_uint64, c_uint64, c_void_p, c_void_p]),
    "cachealloc_create_pool": (c_int, [c_int, c_uint64, c_uint64, c_int, c_int]),
    "cachealloc_create_pool_with_source": (c_int, [c_int, c_uint64, c_uint64, c_int, c_int, c_void_p]),
    "cachealloc_checkpoint_pool": (c_int64, [c_int, c_uint64, c_uint64, c_void_p, c_size_t]),
    "cachealloc_restore_pool": (c_int, [c_int, c_uint64, c_uint64, c_void_p, c_size_t, c_void_p, c_void_p]),
    "cachealloc_pool_use_count": (c_int64, [c_int, c_uint64, c_uint64]),
    "cachealloc_set_pool_use_on_oom": (c_int, [c_int, c_uint64, c_uint64, c_int]),
    "cachealloc_set_pool_no_split": (c_int, [c_int, c_uint64, c_uint64]),
}


class CacheallocError(RuntimeError):
    """A call into libcachealloc failed; the message is ``cachealloc_last_error()``."""


class OutOfMemoryError(CacheallocError):
    """An allocation found no room on the device (or under its memory
    fraction): the library's ``CACHEALLOC_ERROR_OUT_OF_MEMORY``, PyTorch's
    "CUDA out of memory" (which torch raises as ``torch.OutOfMemoryError``).
    The message is the library's."""


#: ``cachealloc_last_error_code()``: the last call succeeded.
OK = 0
#: ``cachealloc_last_error_code()``: the last call ran out of memory.
ERROR_OUT_OF_MEMORY = 1
#: ``cachealloc_last_error_code()``: the last call failed otherwise.
ERROR_OTHER = 2


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, LIBRARY_NAME)
    given = os.environ.get("CACHEALLOC_LIB")
    if given:
        yield os.path.abspath(given)
    root = os.path.dirname(os.path.dirname(here))
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(root, "target")
    for profile in ("release", "debug"):
        yield os.path.join(target, profile, LIBRARY_NAME)


def library_path():
    """The absolute path of the libcachealloc.so this package uses (the one
    ``torch.cuda.memory.CUDAPluggableAllocator`` is given by ``install()``)."""
    tried = []
    for path in _candidates():
        if os.path.isfile(path):
            return path
        tried.append(path)
    raise OSError(
        "cachealloc: %s not found (looked at: %s). Install the cachealloc wheel, "
        "or build it with `cargo build --release -p cachealloc-capi` and set "
        "CACHEALLOC_LIB to its path." % (LIBRARY_NAME, ", ".join(tried))
    )


_LOCK = threading.Lock()
_LIB = None


def lib():
    """The loaded library (a ``ctypes.CDLL``, every prototype declared),
    loaded at the first call."""
    global _LIB
    if _LIB is None:
        with _LOCK:
            if _LIB is None:
                loaded = ctypes.CDLL(library_path())
                for name, (restype, argtypes) in PROTOTYPES.items():
                    fn = getattr(loaded, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
                for name, (restype, argtypes) in DEBUG_PROTOTYPES.items():
                    fn = getattr(loaded, name, None)
                    if fn is not None:
                        fn.restype = restype
                        fn.argtypes = argtypes
                _LIB = loaded
    return _LIB


def has_debug_hooks():
    """Whether the loaded library has the test hooks (feature debug-hooks;
    a released library has none)."""
    return hasattr(lib(), "cachealloc_debug_force_internal_error")


def address(name):
    """The address of exported function ``name``, as PyTorch takes it
    (``ctypes.cast(getattr(lib, name), ctypes.c_void_p).value``)."""
    value = ctypes.cast(getattr(lib(), name), c_void_p).value
    if not value:
        raise CacheallocError("cachealloc: %s has no address" % name)
    return value


def last_error():
    """The message of the last failed call on this thread, or None."""
    msg = lib().cachealloc_last_error()
    return None if msg is None else msg.decode("utf-8", "replace")


def last_error_code():
    """The kind of the last failed call on this thread: ``ERROR_OUT_OF_MEMORY``,
    ``ERROR_OTHER``, or ``OK`` (0) when it succeeded."""
    return lib().cachealloc_last_error_code()


def error(message):
    """The exception for the last failed call on this thread, with
    ``message``: an ``OutOfMemoryError`` if the library says it ran out of
    memory, else a ``CacheallocError``."""
    kind = OutOfMemoryError if last_error_code() == ERROR_OUT_OF_MEMORY else CacheallocError
    return kind(message)


def fail(what):
    """The exception for a failed call (``error``), with the library's message."""
    msg = last_error()
    return error("%s failed: %s" % (what, msg or "no message from the library"))


def check(status, what):
    """Raise for a nonzero status; ``what`` names the call."""
    if status != 0:
        raise fail(what)


def check_void(what):
    """Raise if the void call just made on this thread left an error."""
    msg = last_error()
    if msg is not None:
        raise error("%s failed: %s" % (what, msg))


def version():
    """The C library's version, e.g. ``"0.1.0"``."""
    return lib().cachealloc_version().decode("ascii")


def backend():
    """The kind of device the library runs on: ``"cuda"``, ``"hip"`` or
    ``"mock"`` (``CACHEALLOC_BACKEND``; unset or ``auto``, the GPU that is
    present). Raises when the settings are wrong or no GPU was found."""
    name = lib().cachealloc_backend()
    if name is None:
        raise fail("cachealloc_backend")
    return name.decode("ascii")

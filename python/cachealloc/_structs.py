"""The C header's structures that the Python package reads or fills, as
ctypes structures (capi/include/cachealloc.h); the generated prototypes
(``_prototypes.py``) pass pointers to them, and a pointer to any other
structure as ``c_void_p``."""

import ctypes
from ctypes import c_char_p, c_double, c_int, c_uint64


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


class IpcHandle(ctypes.Structure):
    """``cachealloc_ipc_handle``: the driver's IPC handle of a segment and an
    allocation's offset in it."""

    _fields_ = [("handle", ctypes.c_uint8 * 64), ("offset", c_uint64)]

"""The integer constants, the callback types and the prototype of every
function of libcachealloc's C header (capi/include/cachealloc.h), for ctypes.

Generated from the header by capi/tests/capi.rs (`python_prototypes`): do
not edit. Refresh: CACHEALLOC_BLESS=1 cargo test -p cachealloc-capi --test capi
python_prototypes
"""

from ctypes import CFUNCTYPE, POINTER, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint32, c_uint64, c_void_p  # noqa: F401

from ._structs import Fragmentation, IpcHandle, OomCause, PoolMemory  # noqa: F401

CACHEALLOC_OK = 0
CACHEALLOC_ERROR_OUT_OF_MEMORY = 1
CACHEALLOC_ERROR_OTHER = 2
CACHEALLOC_ERROR_BUFFER_TOO_SMALL = 3
CACHEALLOC_ERROR_EXPANDABLE_SEGMENT = 4
CACHEALLOC_WALK_TRACES = 1
CACHEALLOC_WALK_QUIET = 2

#: ``cachealloc_oom_observer``
OOM_OBSERVER = CFUNCTYPE(None, c_int, c_size_t, c_size_t, c_size_t, c_void_p)
#: ``cachealloc_oom_rejection_observer``
OOM_REJECTION_OBSERVER = CFUNCTYPE(None, c_int, c_size_t, c_size_t, c_size_t, c_void_p)
#: ``cachealloc_trace_tracker``
TRACE_TRACKER = CFUNCTYPE(None, c_void_p, c_void_p)
#: ``cachealloc_oom_cause_observer``
OOM_CAUSE_OBSERVER = CFUNCTYPE(None, c_int, POINTER(OomCause), c_void_p)
#: ``cachealloc_stat_callback``
STAT_CALLBACK = CFUNCTYPE(None, c_char_p, c_int64, c_void_p)
#: ``cachealloc_pool_stats_callback``
POOL_STATS_CALLBACK = CFUNCTYPE(None, c_uint64, c_uint64, c_void_p, c_void_p)
#: ``cachealloc_stream_filter``
STREAM_FILTER = CFUNCTYPE(c_int, c_void_p, c_void_p)
#: ``cachealloc_restore_callback``
RESTORE_CALLBACK = CFUNCTYPE(None, c_void_p, c_size_t, c_int, c_void_p)

#: The C library's test hooks: only a library built with the cargo feature
#: ``debug-hooks`` has them.
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
    "cachealloc_record_history": (c_int, [c_int, c_int, c_size_t]),
    "cachealloc_record_history_ex": (c_int, [c_int, c_int, c_size_t, c_int, c_uint32]),
    "cachealloc_record_annotation": (c_int, [c_int, c_char_p]),
    "cachealloc_share_ipc_handle": (c_int, [c_void_p, POINTER(IpcHandle)]),
    "cachealloc_open_ipc_handle": (c_void_p, [POINTER(IpcHandle), c_int]),
    "cachealloc_close_ipc_handle": (c_int, [POINTER(IpcHandle), c_int]),
    "cachealloc_share_ipc_pages": (c_int, [c_void_p, POINTER(c_int), c_size_t, c_void_p]),
    "cachealloc_open_ipc_pages": (c_void_p, [c_void_p, POINTER(c_int), c_int]),
    "cachealloc_close_ipc_pages": (c_int, [c_void_p, POINTER(c_int), c_int]),
    "cachealloc_enable_peer_access": (c_int, [c_int, c_int]),
    "cachealloc_memcpy_async": (c_int, [c_void_p, c_int, c_void_p, c_int, c_size_t, c_void_p, c_int]),
    "cachealloc_attach_oom_observer": (c_int, [OOM_OBSERVER, c_void_p]),
    "cachealloc_attach_oom_rejection_observer": (c_int, [OOM_REJECTION_OBSERVER, c_void_p]),
    "cachealloc_attach_trace_tracker": (c_int, [TRACE_TRACKER, c_void_p]),
    "cachealloc_last_oom_cause": (c_int, [POINTER(OomCause)]),
    "cachealloc_attach_oom_cause_observer": (c_int, [OOM_CAUSE_OBSERVER, c_void_p]),
    "cachealloc_alloc": (c_void_p, [c_size_t, c_int, c_void_p]),
    "cachealloc_pluggable_alloc": (c_void_p, [c_size_t, c_int, c_void_p]),
    "cachealloc_alloc_aligned": (c_void_p, [c_size_t, c_size_t, c_int, c_void_p]),
    "cachealloc_alloc_at": (c_void_p, [c_size_t, c_int, c_void_p, c_void_p]),
    "cachealloc_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
    "cachealloc_free_checked": (c_int, [c_void_p, c_size_t, c_int, c_void_p]),
    "cachealloc_init": (None, [c_int]),
    "cachealloc_base_alloc": (c_void_p, [c_void_p, POINTER(c_size_t)]),
    "cachealloc_record_stream": (None, [c_void_p, c_void_p]),
    "cachealloc_create_pool_with_source": (c_int, [c_int, c_uint64, c_uint64, c_int, c_int, c_void_p]),
    "cachealloc_snapshot": (c_int, [c_int, c_char_p]),
    "cachealloc_snapshot_walk": (c_int, [c_int, c_int, c_void_p, c_void_p]),
    "cachealloc_memory_stats": (c_int, [c_int, STAT_CALLBACK, c_void_p]),
    "cachealloc_pool_reserved_stats": (c_int, [c_int, POOL_STATS_CALLBACK, c_void_p]),
    "cachealloc_mem_get_info": (c_int, [c_int, POINTER(c_size_t), POINTER(c_size_t)]),
    "cachealloc_cache_info": (c_int, [c_int, POINTER(c_size_t), POINTER(c_size_t)]),
    "cachealloc_get_device_stats": (c_int, [c_int, c_void_p]),
    "cachealloc_begin_allocate_to_pool_filtered": (c_int, [c_int, c_uint64, c_uint64, STREAM_FILTER, c_void_p]),
    "cachealloc_get_allocator_settings": (c_int, [c_void_p]),
    "cachealloc_set_allocator_settings": (c_int, [c_char_p]),
    "cachealloc_checkpoint_pool": (c_int64, [c_int, c_uint64, c_uint64, c_void_p, c_size_t]),
    "cachealloc_restore_pool": (c_int, [c_int, c_uint64, c_uint64, c_void_p, c_size_t, RESTORE_CALLBACK, c_void_p]),
    "cachealloc_empty_cache": (c_int, [c_int]),
    "cachealloc_reset": (None, []),
    "cachealloc_set_memory_fraction": (None, [c_double, c_int]),
    "cachealloc_get_memory_fraction": (c_double, [c_int]),
    "cachealloc_reset_peak_stats": (c_int, [c_int]),
    "cachealloc_reset_accumulated_stats": (c_int, [c_int]),
    "cachealloc_create_pool": (c_int, [c_int, c_uint64, c_uint64, c_int, c_int]),
    "cachealloc_end_allocate_to_pool": (None, [c_int, c_uint64, c_uint64]),
    "cachealloc_begin_allocate_to_pool": (None, [c_int, c_uint64, c_uint64, c_void_p]),
    "cachealloc_mark_capture_begin": (c_int, [c_int]),
    "cachealloc_mark_capture_end": (c_int, [c_int]),
    "cachealloc_release_pool": (None, [c_int, c_uint64, c_uint64]),
    "cachealloc_pool_use_count": (c_int64, [c_int, c_uint64, c_uint64]),
    "cachealloc_set_pool_use_on_oom": (c_int, [c_int, c_uint64, c_uint64, c_int]),
    "cachealloc_set_pool_no_split": (c_int, [c_int, c_uint64, c_uint64]),
    "cachealloc_empty_cache_pool": (c_int, [c_int, c_uint64, c_uint64]),
    "cachealloc_release_ipc_share": (c_int, [c_void_p]),
}

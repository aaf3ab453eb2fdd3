"""cachealloc's own statistics, cache, history and snapshot calls: the
``torch.cuda`` functions that raise once a pluggable allocator is installed
(``memory_stats``, ``memory_allocated``, ``memory_summary``,
``_record_memory_history``, ``_dump_snapshot``, ...), with the same names,
keys and values, read from libcachealloc.so.

``device`` is a device index, ``"cuda:N"``, a ``torch.device``, or None:
the current torch device if torch's CUDA is initialised, else 0.
"""

import collections
import ctypes
import operator
import os
import pickle
import sys
import tempfile
import threading

from . import _lib

CacheInfo = collections.namedtuple("CacheInfo", ["total_cached", "largest_block"])
CacheInfo.__doc__ = """Bytes in cached (free) blocks, and the largest of them."""


def _current_device():
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:  # a torch without CUDA, or a stand-in: device 0
        pass
    return 0


def device_index(device, all_allowed=False):
    """The device index of ``device`` (see the module's docstring); -1 (every
    device) only where ``all_allowed``."""
    if device is None:
        return _current_device()
    if isinstance(device, bool):
        raise TypeError("cachealloc: device must be an index, 'cuda:N' or a torch.device, not a bool")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str):
        kind, _, num = device.partition(":")
        if kind not in ("cuda", "hip") and not device.lstrip("-").isdigit():
            raise ValueError("cachealloc: expected a CUDA device, got %r" % device)
        if device.lstrip("-").isdigit():
            index = int(device)
        else:
            index = int(num) if num else _current_device()
    elif hasattr(device, "index"):
        kind = getattr(device, "type", "cuda")
        if kind not in ("cuda", "hip"):
            raise ValueError("cachealloc: expected a CUDA device, got %r" % (device,))
        index = device.index if device.index is not None else _current_device()
    else:
        raise TypeError("cachealloc: device must be an index, 'cuda:N' or a torch.device, got %r" % (device,))
    if index < 0 and not (all_allowed and index == -1):
        raise ValueError("cachealloc: bad device index %d" % index)
    return index


def memory_stats(device=None):
    """``torch.cuda.memory_stats(device)``: an OrderedDict of every key
    (``"allocated_bytes.all.current"``, ``"num_device_alloc"``, ...), sorted,
    with the values PyTorch's native allocator would report."""
    d = device_index(device)
    out = collections.OrderedDict()

    def collect(key, value, _user):
        out[key.decode("ascii")] = value

    callback = _lib.STAT_CALLBACK(collect)
    _lib.check(_lib.lib().cachealloc_memory_stats(d, callback, None), "cachealloc_memory_stats(%d)" % d)
    return out


def memory_allocated(device=None):
    """``torch.cuda.memory_allocated``: bytes held by live allocations."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    """``torch.cuda.max_memory_allocated``: the peak of ``memory_allocated``."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    """``torch.cuda.memory_reserved``: bytes of device memory the cache holds."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    """``torch.cuda.max_memory_reserved``: the peak of ``memory_reserved``."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    """``torch.cuda.reset_peak_memory_stats``: every peak becomes its current value."""
    d = device_index(device)
    _lib.check(_lib.lib().cachealloc_reset_peak_stats(d), "cachealloc_reset_peak_stats(%d)" % d)


def reset_accumulated_memory_stats(device=None):
    """``torch.cuda.reset_accumulated_memory_stats``: the accumulated counts
    (``*.allocated``, ``*.freed``, ``num_alloc_retries``, ``num_ooms``,
    ``num_device_alloc``, ...) become 0."""
    d = device_index(device)
    _lib.check(_lib.lib().cachealloc_reset_accumulated_stats(d), "cachealloc_reset_accumulated_stats(%d)" % d)


def empty_cache(device=-1):
    """``torch.cuda.empty_cache()``: return every entirely free cached segment
    to the device, on every device used so far (or on ``device``)."""
    d = device_index(device, all_allowed=True)
    _lib.check(_lib.lib().cachealloc_empty_cache(d), "cachealloc_empty_cache(%d)" % d)


def set_per_process_memory_fraction(fraction, device=None):
    """``torch.cuda.set_per_process_memory_fraction``: no new segment may take
    the device's reserved memory above ``fraction`` (0 to 1) of its total."""
    d = device_index(device)
    lib = _lib.lib()
    lib.cachealloc_set_memory_fraction(float(fraction), d)
    _lib.check_void("cachealloc_set_memory_fraction(%r, %d)" % (fraction, d))


def set_allocator_settings(settings):
    """``torch.cuda.memory._set_allocator_settings``: apply a later settings
    string (``PYTORCH_CUDA_ALLOC_CONF`` syntax) to every device, and to those
    used from now on, with torch's rules for the keys it leaves out (kept or
    reset, as the selected torch release does). A bad string raises and
    changes nothing."""
    _lib.check(_lib.lib().cachealloc_set_allocator_settings(settings.encode()),
               "cachealloc_set_allocator_settings(%r)" % settings)


def get_per_process_memory_fraction(device=None):
    """``torch.cuda.get_per_process_memory_fraction``: the device's memory
    limit over its total memory (1.0 with none), whoever set it."""
    d = device_index(device)
    fraction = _lib.lib().cachealloc_get_memory_fraction(d)
    if fraction < 0:
        raise _lib.fail("cachealloc_get_memory_fraction(%d)" % d)
    return fraction


def cache_info(device=None):
    """``CacheInfo(total_cached, largest_block)`` of ``device`` (PyTorch's
    ``cacheInfo``): bytes in cached free blocks and the largest of them."""
    d = device_index(device)
    total, largest = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _lib.check(
        _lib.lib().cachealloc_cache_info(d, ctypes.byref(total), ctypes.byref(largest)),
        "cachealloc_cache_info(%d)" % d,
    )
    return CacheInfo(total.value, largest.value)


def _pool_dict(m):
    return {name: getattr(m, name) for name, _ in _lib.PoolMemory._fields_}


def memory_fragmentation(device=None, stream=None):
    """Where ``device``'s reserved memory is, pool by pool (cachealloc's
    accounting, beside PyTorch's ``memory_stats`` keys, which keep their
    values): a dict with ``device``, ``small_pool``, ``large_pool`` and
    ``private_pools`` (each: ``reserved_bytes``, ``allocated_bytes``,
    ``requested_bytes``, ``free_bytes``, ``largest_free_block``,
    ``free_blocks``, ``pending_free_bytes``, ``unmapped_bytes``,
    ``external_fragmentation`` = 1 - largest free block / free bytes), and
    ``stream_free_bytes`` / ``other_streams_free_bytes``: bytes cached in
    the default pools for requests on ``stream`` (an integer handle; None:
    the default stream) and in other streams' blocks, which those requests
    never get. Counted at the call, in one pass over the blocks."""
    d = device_index(device)
    f = _lib.Fragmentation()
    s = ctypes.c_void_p(int(stream or 0))
    _lib.check(_lib.lib().cachealloc_get_fragmentation(d, s, ctypes.byref(f)),
               "cachealloc_get_fragmentation(%d)" % d)
    out = {name: _pool_dict(getattr(f, name)) for name in ("device", "small_pool", "large_pool", "private_pools")}
    out.update(stream=f.stream, stream_free_bytes=f.stream_free_bytes,
               other_streams_free_bytes=f.other_streams_free_bytes)
    return out


def pool_memory(pool_id=(0, 0), large=True, device=None):
    """One pool's memory (the dict of ``memory_fragmentation``'s pools): the
    large (or small) pool of the default pools, or of private pool
    ``pool_id`` (a ``torch.cuda.graph_pool_handle()`` pair)."""
    d = device_index(device)
    m = _lib.PoolMemory()
    a, b = pool_id
    _lib.check(_lib.lib().cachealloc_get_pool_memory(d, int(a), int(b), int(bool(large)), ctypes.byref(m)),
               "cachealloc_get_pool_memory(%d)" % d)
    return _pool_dict(m)


def _cause_dict(c):
    out = {name: getattr(c, name) for name, _ in _lib.OomCause._fields_ if name not in ("class_", "class_name")}
    out["class"] = c.class_name.decode()
    return out


def last_oom_cause():
    """Why this thread's last out-of-memory happened (None if it had none):
    ``class`` (``capacity``, ``memory_fraction``, ``fragmentation``,
    ``pending_frees``, ``other_streams``, ``private_pools``, ``mixed``,
    ``other_memory``, ``other_size``, ``rejected``, ``pool_allocator``) and the bytes behind it (``needed``, ``live_bytes``,
    ``limit``, ``segment``, ``headroom``, ``free_bytes``,
    ``largest_free_block``, ``pending_free_bytes``, ``other_streams_bytes``,
    ``private_pools_bytes``, ``other_size_bytes``, ``unmapped_bytes``). The
    exception's message ends with the same verdict in words. None too
    after a request refused before the allocator (1 EiB or more)."""
    c = _lib.OomCause()
    r = _lib.lib().cachealloc_last_oom_cause(ctypes.byref(c))
    _lib.check(-1 if r < 0 else 0, "cachealloc_last_oom_cause")
    return None if r == 1 else _cause_dict(c)


def attach_oom_cause_observer(observer):
    """Call ``observer(device, cause)`` at every final out-of-memory, with
    ``cause`` the dict of ``last_oom_cause``, right before the observers of
    ``attach_oom_observer`` (outside the device's lock: it may call
    cachealloc). There is no detach."""
    if not callable(observer):
        raise TypeError("cachealloc: the observer must be callable")

    def trampoline(device, cause, _user):
        try:
            observer(device, _cause_dict(cause.contents))
        except BaseException as e:  # never unwind into the library
            print("cachealloc: the out-of-memory cause observer raised %r" % (e,), file=sys.stderr)

    fn = _lib.OOM_CAUSE_OBSERVER(trampoline)
    _lib.check(_lib.lib().cachealloc_attach_oom_cause_observer(fn, None),
               "cachealloc_attach_oom_cause_observer")
    _OBSERVERS.append(fn)


def record_history(enabled=True, max_entries=0, device=-1):
    """``torch.cuda.memory._record_memory_history``: start (``enabled`` true,
    or ``"all"`` / ``"state"``) or stop (False / None) recording the memory
    history that ``snapshot()`` writes, of ``device`` or (-1) of every device,
    present and future. At most ``max_entries`` are kept (0: as many as
    ``CACHEALLOC_HISTORY_CAPACITY``), the oldest dropped first. Stopping
    empties the history: take the snapshot first. No Python stacks are
    recorded (frames are empty)."""
    on = bool(enabled) and enabled not in ("none", "None")
    d = device_index(device, all_allowed=True)
    n = int(max_entries or 0)
    if n < 0:
        raise ValueError("cachealloc: max_entries must be >= 0")
    n = min(n, ctypes.c_size_t(-1).value)
    _lib.check(_lib.lib().cachealloc_record_history(d, int(on), n), "cachealloc_record_history(%d)" % d)


def record_annotation(name, device=-1):
    """Mark this point of the history with ``name`` (a snapshot lists it
    under ``external_annotations``), on ``device`` or (-1) on every device
    used so far. Recorded only while the history is."""
    d = device_index(device, all_allowed=True)
    _lib.check(
        _lib.lib().cachealloc_record_annotation(d, str(name).encode("utf-8")),
        "cachealloc_record_annotation(%d, %r)" % (d, name),
    )


def snapshot(path=None, device=-1):
    """Write the memory snapshot of ``device`` (-1: every device used so far),
    in PyTorch's format, to ``path``: a pickle for pytorch.org/memory_viz, or
    JSON when ``path`` ends in ``.json`` (``torch.cuda.memory._dump_snapshot``).
    With no ``path``, return the snapshot as a dict instead
    (``torch.cuda.memory._snapshot()``)."""
    d = device_index(device, all_allowed=True)
    if path is None:
        fd, tmp = tempfile.mkstemp(prefix="cachealloc-", suffix=".pickle")
        os.close(fd)
        try:
            snapshot(tmp, d)
            with open(tmp, "rb") as f:
                return pickle.load(f)
        finally:
            os.unlink(tmp)
    _lib.check(
        _lib.lib().cachealloc_snapshot(d, os.fsencode(os.fspath(path))),
        "cachealloc_snapshot(%d, %r)" % (d, os.fspath(path)),
    )
    return None


_RAW = {}  # caching_allocator_alloc's live allocations: ptr -> (size, device, stream)
# The addresses caching_allocator_delete freed last (not handed out again
# since), to tell a double free from an address never allocated here.
_FREED = collections.OrderedDict()
_FREED_KEPT = 4096
_RAW_LOCK = threading.Lock()
_SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1


def _stream_handle(stream):
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream or None
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if handle is None:
        raise TypeError("cachealloc: stream must be an int handle or a torch.cuda.Stream, got %r" % (stream,))
    return int(handle) or None


def caching_allocator_alloc(size, device=None, stream=None):
    """``torch.cuda.caching_allocator_alloc``: ``size`` bytes from the cache of
    ``device`` for use on ``stream`` (a ``torch.cuda.Stream``, a raw
    ``cudaStream_t`` as an int, or None: the default stream); the address,
    an int. Free it with ``caching_allocator_delete``. (On the simulated
    device the address is a number, not memory.)"""
    if isinstance(size, bool):
        raise TypeError("cachealloc: caching_allocator_alloc: size must be an int (bytes), got %r" % (size,))
    try:
        size = operator.index(size)
    except TypeError:
        raise TypeError("cachealloc: caching_allocator_alloc: size must be an int (bytes), got %r"
                        % (size,)) from None
    if size < 0:
        raise ValueError("cachealloc: caching_allocator_alloc: size must not be negative, got %d" % size)
    if size > _SIZE_MAX:
        raise ValueError("cachealloc: caching_allocator_alloc: size %d is more than a size_t holds (%d)"
                         % (size, _SIZE_MAX))
    d = device_index(device)
    s = _stream_handle(stream)
    ptr = _lib.lib().cachealloc_alloc(size, d, s)
    if ptr is None:
        msg = _lib.last_error()
        if msg is not None:
            raise _lib.error("cachealloc_alloc(%d) failed: %s" % (size, msg))
        return 0  # zero bytes: NULL, as in PyTorch
    with _RAW_LOCK:
        _RAW[ptr] = (size, d, s)
        _FREED.pop(ptr, None)
    return ptr


def caching_allocator_delete(ptr):
    """``torch.cuda.caching_allocator_delete``: free an address that
    ``caching_allocator_alloc`` returned (0 is a no-op). Any other address,
    or one already freed, raises ``CacheallocError`` ("invalid device
    pointer", as torch's RuntimeError says)."""
    if not ptr:
        return
    ptr = operator.index(ptr)
    with _RAW_LOCK:
        entry = _RAW.pop(ptr, None)
        freed = entry is None and ptr in _FREED
    if entry is None:
        raise _lib.CacheallocError(
            "cachealloc: invalid device pointer: %#x (%s)"
            % (ptr, "already freed by caching_allocator_delete" if freed
               else "not an address caching_allocator_alloc returned"))
    size, d, s = entry
    if _lib.lib().cachealloc_free_checked(ptr, size, d, s) != 0:
        raise _lib.fail("cachealloc_free(%#x)" % ptr)
    with _RAW_LOCK:
        if ptr not in _RAW:  # not handed out again meanwhile
            _FREED[ptr] = None
            _FREED.move_to_end(ptr)
            while len(_FREED) > _FREED_KEPT:
                _FREED.popitem(last=False)


_OBSERVERS = []  # the ctypes callbacks attached: they must live as long as the process


def _attach(c_function, what, observer):
    """Attach ``observer`` (called with four numbers) through the C
    function ``c_function``; what it raises is printed, never unwound into
    the library."""
    if not callable(observer):
        raise TypeError("cachealloc: the observer must be callable")

    def trampoline(device, a, b, c, _user):
        try:
            observer(device, a, b, c)
        except BaseException as e:  # never unwind into the library
            print("cachealloc: the %s raised %r" % (what, e), file=sys.stderr)

    fn = _lib.OOM_OBSERVER(trampoline)
    _lib.check(getattr(_lib.lib(), c_function)(fn, None), c_function)
    _OBSERVERS.append(fn)


def attach_oom_observer(observer):
    """Call ``observer(device, alloc_size, device_total, device_free)`` at every
    final out-of-memory of any device, before the failing allocation returns
    NULL (``torch._C._cuda_attach_out_of_memory_observer``). It runs on the
    allocating thread once that device's lock is released (PyTorch's order),
    so it may call cachealloc, on that device too: read ``memory_stats``,
    ``record_annotation``, take a ``snapshot``, free memory. There is no
    detach."""
    _attach("cachealloc_attach_oom_observer", "out-of-memory observer", observer)


def attach_oom_rejection_observer(observer):
    """Call ``observer(device, alloc_size, total_allocated, device_total)``
    for every request the rejection policy refuses before any device call
    (``throw_on_cudamalloc_oom:True``, torch 2.12 on; torch's
    ``attachOomRejectionObserver``): the segment it would have made, the
    bytes reserved then, the device's memory. It runs on the allocating
    thread once the device's lock is released; what it raises is printed.
    The allocation then fails with torch's message ("... preemptively
    rejected ..."). There is no detach."""
    _attach("cachealloc_attach_oom_rejection_observer", "OOM rejection observer", observer)


# memory_summary, in the layout of torch.cuda.memory_summary.

_WIDTH = 75


def _scaled(value, scale_by, units, base, threshold, layout):
    """`value` in the largest unit that keeps `scale_by` (the row's peak)
    below `threshold` of it, as torch.cuda.memory_summary writes it."""
    unit = 0
    while unit + 1 < len(units) and scale_by >= threshold * base:
        value //= base
        scale_by /= base
        unit += 1
    return layout % (value, units[unit])


def _format_size(value, scale_by):
    return _scaled(value, scale_by, ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"], 1024, 768, "%6d %s")


def _format_count(value, scale_by):
    return _scaled(value, scale_by, [" ", "K", "M"], 1000, 750, "%7d %s ")


_ROWS = [
    ("allocated_bytes", "Allocated memory", _format_size),
    ("active_bytes", "Active memory", _format_size),
    ("requested_bytes", "Requested memory", _format_size),
    ("reserved_bytes", "GPU reserved memory", _format_size),
    ("inactive_split_bytes", "Non-releasable memory", _format_size),
    ("allocation", "Allocations", _format_count),
    ("active", "Active allocs", _format_count),
    ("segment", "GPU reserved segments", _format_count),
    ("inactive_split", "Non-releasable allocs", _format_count),
]


def memory_summary(device=None, abbreviated=False):
    """``torch.cuda.memory_summary``: a table of the statistics of
    ``device``: allocated, active, requested, reserved and non-releasable
    memory and the matching counts, each with its current value, peak,
    total allocated and total freed, in human units (with the large and
    small pools on their own rows unless ``abbreviated``)."""
    d = device_index(device)
    stats = memory_stats(d)

    def cells(prefix, fmt, scale):
        return " | ".join(
            fmt(stats.get(prefix + part, 0), scale[i]) for i, part in enumerate(("current", "peak", "allocated", "freed"))
        )

    lines = ["=" * _WIDTH]
    lines.append(("cachealloc %s memory summary, device ID %d" % (_lib.version(), d)).center(_WIDTH))
    lines.append("-" * _WIDTH)
    lines.append(
        ("OOMs: %d  |  device alloc retries: %d  |  device allocs: %d, frees: %d" % (
            stats.get("num_ooms", 0), stats.get("num_alloc_retries", 0),
            stats.get("num_device_alloc", 0), stats.get("num_device_free", 0),
        )).center(_WIDTH)
    )
    lines.append("=" * _WIDTH)
    lines.append("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ")
    for key, name, fmt in _ROWS:
        lines.append("-" * _WIDTH)
        pools = [("all", name)]
        if not abbreviated:
            pools += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        # Every row of a metric is scaled like its "all" row, as in torch.
        scale = [stats.get("%s.all.%s" % (key, p), 0) for p in ("current", "peak", "allocated", "freed")]
        for pool, label in pools:
            lines.append(" %-21s | %s " % (label, cells("%s.%s." % (key, pool), fmt, scale)))
    for key, name in (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize GPU segments")):
        lines.append("-" * _WIDTH)
        scale = [stats.get("%s.%s" % (key, p), 0) for p in ("current", "peak", "allocated", "freed")]
        lines.append(" %-21s | %s " % (name, cells(key + ".", _format_count, scale)))
    lines.append("=" * _WIDTH)
    return "|" + "|\n|".join(lines) + "|\n"

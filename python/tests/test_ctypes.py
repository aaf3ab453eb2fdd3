"""cachealloc's Python package on the simulated device (no torch, no GPU).

    bash python/ci-check.sh                          (the wheel, in a fresh venv)
    cd python && python3 -m unittest discover -s tests  (the source tree, with
                                  ../target/release/libcachealloc.so built)

The library reads its settings once per process: this module sets them
before its first call (the simulated device, 1 GiB per device), and every
test uses a device of its own, so that the tests do not see each other's
statistics.
"""

import contextlib
import ctypes
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
import types
import unittest
import warnings
from ctypes import POINTER, c_double, c_int, c_size_t, c_uint64, c_void_p
from unittest import mock

os.environ["CACHEALLOC_BACKEND"] = "mock"
os.environ["CACHEALLOC_MOCK_CAPACITY"] = "1GiB"
os.environ["CACHEALLOC_CONF"] = ""
os.environ["CACHEALLOC_SLOTS"] = "65536"
os.environ["CACHEALLOC_HISTORY_CAPACITY"] = "4096"

import cachealloc  # noqa: E402
from cachealloc import _lib  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30

# PyTorch's own prototypes for the pluggable ABI (torch/cuda/memory.py) ...
_ALLOC_FN = ctypes.CFUNCTYPE(c_void_p, c_size_t, c_int, c_void_p)
_FREE_FN = ctypes.CFUNCTYPE(None, c_void_p, c_size_t, c_int, c_void_p)
# ... and the hooks' function types (torch/csrc/cuda/Module.cpp's setters),
# the pool id (a std::pair of two unsigned long long) as two integers.
_INIT_FN = ctypes.CFUNCTYPE(None, c_int)
_RESET_FN = ctypes.CFUNCTYPE(None)
_FRACTION_FN = ctypes.CFUNCTYPE(None, c_double, c_int)
_BASE_ALLOC_FN = ctypes.CFUNCTYPE(c_void_p, c_void_p, POINTER(c_size_t))
_RECORD_STREAM_FN = ctypes.CFUNCTYPE(None, c_void_p, c_void_p)
_BEGIN_POOL_FN = ctypes.CFUNCTYPE(None, c_int, c_uint64, c_uint64, c_void_p)
_POOL_FN = ctypes.CFUNCTYPE(None, c_int, c_uint64, c_uint64)


def torch_style(name, prototype):
    """What torch does with a name: CDLL(path), then the function's address
    through ctypes.cast, here rebuilt as a callable of `prototype`."""
    handle = ctypes.CDLL(cachealloc.library_path())
    addr = ctypes.cast(getattr(handle, name), c_void_p).value
    assert addr, name
    return prototype(addr)


@contextlib.contextmanager
def quiet_stderr():
    """File descriptor 2 to /dev/null meanwhile (what the library writes there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


_next_device = [0]
_device_lock = threading.Lock()


def fresh_device():
    """A device no other test has used."""
    with _device_lock:
        d = _next_device[0]
        _next_device[0] += 1
    assert d < 64
    return d


def stat_keys():
    """Every key of torch.cuda.memory_stats(), sorted."""
    keys = []
    for stat in ["active", "active_bytes", "allocated_bytes", "allocation", "inactive_split",
                 "inactive_split_bytes", "requested_bytes", "reserved_bytes", "segment"]:
        for pool in ["all", "large_pool", "small_pool"]:
            for part in ["allocated", "current", "freed", "peak"]:
                keys.append("%s.%s.%s" % (stat, pool, part))
    keys += ["max_split_size", "num_alloc_retries", "num_device_alloc", "num_device_free",
             "num_oom_rejections", "num_ooms", "num_sync_all_streams"]  # torch 2.12 on
    for stat in ["oversize_allocations", "oversize_segments"]:
        for part in ["allocated", "current", "freed", "peak"]:
            keys.append("%s.%s" % (stat, part))
    return sorted(keys)


class Library(unittest.TestCase):
    def test_library_is_found_and_versioned(self):
        path = cachealloc.library_path()
        self.assertTrue(os.path.isfile(path), path)
        self.assertEqual(os.path.basename(path), "libcachealloc.so")
        self.assertRegex(cachealloc.version(), r"^\d+\.\d+\.\d+")
        where = os.environ.get("CACHEALLOC_EXPECT_PREFIX")
        if where:  # ci-check.sh: the installed wheel's copy, not the source tree's
            self.assertTrue(os.path.realpath(path).startswith(os.path.realpath(where) + os.sep), path)
            self.assertTrue(os.path.realpath(cachealloc.__file__).startswith(os.path.realpath(where) + os.sep))

    def test_every_header_function_has_a_prototype(self):
        header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "capi", "include",
                              "cachealloc.h")
        if not os.path.isfile(header):
            self.skipTest("no capi/include/cachealloc.h beside these tests")
        with open(header, encoding="utf-8") as f:
            declared = re.findall(r"\b(cachealloc_\w+)\(", f.read())
        self.assertTrue(declared)
        self.assertEqual(sorted(set(declared)), sorted(set(_lib.PROTOTYPES) | set(_lib.DEBUG_PROTOTYPES)))
        for name in _lib.PROTOTYPES:
            fn = getattr(_lib.lib(), name)
            self.assertIsNotNone(fn.argtypes, name)

    def test_import_needs_no_torch(self):
        code = ("import sys; import cachealloc; assert 'torch' not in sys.modules, 'torch imported'; "
                "sys.modules['torch'] = None; "  # any later `import torch` fails
                "s = cachealloc.memory_stats(0); assert s['allocation.all.current'] == 0; "
                "print(cachealloc.installed())")
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True)
        self.assertEqual((out.returncode, out.stdout.strip()), (0, "False"), out.stdout)


class PluggableAbi(unittest.TestCase):
    def test_alloc_free_from_threads_through_torch_prototypes(self):
        alloc = torch_style("cachealloc_alloc", _ALLOC_FN)
        free = torch_style("cachealloc_free", _FREE_FN)
        d = fresh_device()
        threads, per_thread, errors = 8, 400, []
        live, live_lock = set(), threading.Lock()

        def worker(t):
            try:
                stream = c_void_p(0x1000 + t)  # any value names a stream on the mock
                mine = []
                for i in range(per_thread):
                    size = (i % 13 + 1) * 4096 * (1 + t % 3) + (MiB * 3 if i % 7 == 0 else 0)
                    p = alloc(size, d, stream)
                    if p is None:
                        errors.append("NULL: %s" % cachealloc._lib.last_error())
                        return
                    with live_lock:
                        if p in live:
                            errors.append("address %#x handed out twice" % p)
                        live.add(p)
                    mine.append((p, size))
                    if len(mine) > 20:
                        q, qsize = mine.pop(0)
                        with live_lock:
                            live.discard(q)
                        free(q, qsize, d, stream)
                for q, qsize in mine:
                    with live_lock:
                        live.discard(q)
                    free(q, qsize, d, stream)
            except Exception as e:  # pragma: no cover
                errors.append(repr(e))

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        self.assertEqual(errors, [])
        s = cachealloc.memory_stats(d)
        self.assertEqual(s["allocation.all.allocated"], threads * per_thread)
        self.assertEqual(s["allocation.all.freed"], threads * per_thread)
        self.assertEqual(s["allocation.all.current"], 0)
        self.assertEqual(s["allocated_bytes.all.current"], 0)
        self.assertGreater(s["reserved_bytes.all.current"], 0)
        cachealloc.empty_cache(d)
        self.assertEqual(cachealloc.memory_reserved(d), 0)

    def test_zero_bytes_and_null_free(self):
        alloc = torch_style("cachealloc_alloc", _ALLOC_FN)
        free = torch_style("cachealloc_free", _FREE_FN)
        d = fresh_device()
        self.assertIsNone(alloc(0, d, None))
        self.assertIsNone(_lib.last_error())
        free(None, 0, d, None)
        self.assertIsNone(_lib.last_error())

    def test_bad_free_is_reported(self):
        lib = _lib.lib()
        d = fresh_device()
        p = lib.cachealloc_alloc(MiB, d, None)
        self.assertTrue(p)
        self.assertEqual(lib.cachealloc_free_checked(p, MiB, d, None), 0)
        self.assertEqual(lib.cachealloc_free_checked(p, MiB, d, None), -1)
        self.assertTrue(_lib.last_error())
        lib.cachealloc_free(p + 64, MiB, d, None)
        self.assertTrue(_lib.last_error())

    def test_aligned_alloc(self):
        lib = _lib.lib()
        d = fresh_device()
        for align in (64, 4096, 2 * MiB):
            p = lib.cachealloc_alloc_aligned(1000, align, d, None)
            self.assertTrue(p)
            self.assertEqual(p % align, 0)
            self.assertEqual(lib.cachealloc_free_checked(p, 1000, d, None), 0)
        self.assertIsNone(lib.cachealloc_alloc_aligned(1000, 3000, d, None))
        self.assertIn("not a power of two", _lib.last_error())

    def test_ipc_share_open_close_between_two_devices(self):
        lib = _lib.lib()
        d0, d1 = fresh_device(), fresh_device()
        x = lib.cachealloc_alloc(MiB, d0, None)
        h = _lib.IpcHandle()
        self.assertEqual(lib.cachealloc_share_ipc_handle(x, ctypes.byref(h)), 0)
        p = lib.cachealloc_open_ipc_handle(ctypes.byref(h), d1)
        self.assertEqual(p, x)  # the simulated machine maps at the exporter's address
        self.assertEqual(lib.cachealloc_open_ipc_handle(ctypes.byref(h), d1), p)
        self.assertEqual(lib.cachealloc_close_ipc_handle(ctypes.byref(h), d1), 0)
        self.assertEqual(lib.cachealloc_close_ipc_handle(ctypes.byref(h), d1), 0)
        self.assertEqual(lib.cachealloc_close_ipc_handle(ctypes.byref(h), d1), -1)
        self.assertEqual(lib.cachealloc_enable_peer_access(d0, d1), 0)
        self.assertEqual(lib.cachealloc_enable_peer_access(d0, d1), 0)
        self.assertEqual(lib.cachealloc_memcpy_async(x, d0, x, d0, 16, None, 0), 0)
        lib.cachealloc_free(x, MiB, d0, None)  # held until the share is released
        self.assertEqual(cachealloc.memory_stats(d0)["allocation.all.current"], 1)
        self.assertEqual(lib.cachealloc_release_ipc_share(x), 0)
        self.assertEqual(cachealloc.memory_stats(d0)["allocation.all.current"], 0)

    def test_hooks_through_torch_prototypes(self):
        alloc = torch_style("cachealloc_alloc", _ALLOC_FN)
        free = torch_style("cachealloc_free", _FREE_FN)
        init = torch_style("cachealloc_init", _INIT_FN)
        reset = torch_style("cachealloc_reset", _RESET_FN)
        fraction = torch_style("cachealloc_set_memory_fraction", _FRACTION_FN)
        base_alloc = torch_style("cachealloc_base_alloc", _BASE_ALLOC_FN)
        record_stream = torch_style("cachealloc_record_stream", _RECORD_STREAM_FN)
        begin = torch_style("cachealloc_begin_allocate_to_pool", _BEGIN_POOL_FN)
        end = torch_style("cachealloc_end_allocate_to_pool", _POOL_FN)
        release = torch_style("cachealloc_release_pool", _POOL_FN)
        d = fresh_device()

        init(0)
        init(4)
        self.assertIsNone(_lib.last_error())

        p = alloc(1000, d, None)
        self.assertTrue(p)
        size = c_size_t(0)
        base = base_alloc(c_void_p(p + 100), ctypes.byref(size))
        self.assertEqual(base, p)  # the first block of its segment
        self.assertEqual(size.value, 2 * MiB)  # a small segment
        record_stream(p, c_void_p(0x77))
        self.assertIsNone(_lib.last_error())
        free(p, 1000, d, None)

        begin(d, 1, 0, None)
        self.assertIsNone(_lib.last_error())
        q = alloc(4 * MiB, d, c_void_p(0x55))
        self.assertTrue(q)
        end(d, 1, 0)
        self.assertIsNone(_lib.last_error())
        end(d, 1, 0)
        self.assertTrue(_lib.last_error())  # not routing to that pool any more
        free(q, 4 * MiB, d, c_void_p(0x55))
        release(d, 1, 0)
        self.assertIsNone(_lib.last_error())
        reset()
        self.assertEqual(cachealloc.memory_reserved(d), 0)

        fraction(0.25, d)  # of the 1 GiB simulated device
        self.assertIsNone(_lib.last_error())
        self.assertIsNone(alloc(512 * MiB, d, None))
        self.assertIn("out of memory", _lib.last_error())
        r = alloc(64 * MiB, d, None)
        self.assertTrue(r)
        free(r, 64 * MiB, d, None)


class Stats(unittest.TestCase):
    def test_keys_and_values(self):
        lib = _lib.lib()
        d = fresh_device()
        s = cachealloc.memory_stats(d)
        self.assertIsInstance(s, dict)
        self.assertEqual(list(s), stat_keys())
        self.assertTrue(all(v == 0 for k, v in s.items() if k != "max_split_size"))
        self.assertEqual(s["max_split_size"], -1)

        small = lib.cachealloc_alloc(MiB, d, None)  # small pool: a 2 MiB segment
        large = lib.cachealloc_alloc(3 * MiB, d, None)  # large pool: a 20 MiB segment
        self.assertTrue(small and large)
        s = cachealloc.memory_stats(d)
        self.assertEqual(s["allocation.all.current"], 2)
        self.assertEqual(s["allocation.small_pool.current"], 1)
        self.assertEqual(s["allocation.large_pool.current"], 1)
        self.assertEqual(s["allocated_bytes.all.current"], 4 * MiB)
        self.assertEqual(s["requested_bytes.all.current"], 4 * MiB)
        self.assertEqual(s["segment.all.current"], 2)
        self.assertEqual(s["num_device_alloc"], 2)
        self.assertEqual(s["reserved_bytes.all.current"], 22 * MiB)
        self.assertEqual(s["reserved_bytes.all.peak"], 22 * MiB)
        self.assertEqual(cachealloc.memory_allocated(d), 4 * MiB)
        self.assertEqual(cachealloc.memory_reserved(d), 22 * MiB)
        self.assertEqual(cachealloc.memory_allocated("cuda:%d" % d), 4 * MiB)

        lib.cachealloc_free(small, MiB, d, None)
        lib.cachealloc_free(large, 3 * MiB, d, None)
        self.assertEqual(cachealloc.memory_allocated(d), 0)
        self.assertEqual(cachealloc.max_memory_allocated(d), 4 * MiB)
        self.assertEqual(cachealloc.cache_info(d), cachealloc.CacheInfo(22 * MiB, 20 * MiB))
        cachealloc.empty_cache()  # every device
        s = cachealloc.memory_stats(d)
        self.assertEqual(s["reserved_bytes.all.current"], 0)
        self.assertEqual(s["reserved_bytes.all.peak"], 22 * MiB)
        self.assertEqual(s["num_device_free"], 2)
        self.assertEqual(cachealloc.max_memory_reserved(d), 22 * MiB)
        self.assertEqual(cachealloc.cache_info(d), (0, 0))

        cachealloc.reset_peak_memory_stats(d)
        self.assertEqual(cachealloc.max_memory_reserved(d), 0)
        self.assertEqual(cachealloc.max_memory_allocated(d), 0)
        self.assertEqual(cachealloc.memory_stats(d)["num_device_alloc"], 2)
        cachealloc.reset_accumulated_memory_stats(d)
        s = cachealloc.memory_stats(d)
        self.assertEqual((s["num_device_alloc"], s["num_device_free"], s["allocation.all.allocated"]), (0, 0, 0))

    def test_summary(self):
        lib = _lib.lib()
        d = fresh_device()
        p = lib.cachealloc_alloc(300 * MiB, d, None)  # shown as 307200 KiB: torch's rule
        self.assertTrue(p)
        text = cachealloc.memory_summary(d)
        lines = text.splitlines()
        self.assertTrue(all(len(line) == 77 for line in lines), [len(line) for line in lines])
        self.assertIn("device ID %d" % d, text)
        for row in ["Allocated memory", "Active memory", "Requested memory", "GPU reserved memory",
                    "Allocations", "GPU reserved segments", "from large pool", "Oversize allocations"]:
            self.assertIn(row, text)
        self.assertRegex(text, r"Allocated memory\s+\|\s+307200 KiB \|\s+307200 KiB \|\s+307200 KiB \|\s+0 B  ")
        short = cachealloc.memory_summary(d, abbreviated=True)
        self.assertNotIn("from large pool", short)
        lib.cachealloc_free(p, 300 * MiB, d, None)

    def test_bad_device_raises_with_the_library_message(self):
        with self.assertRaises(RuntimeError) as cm:
            cachealloc.memory_stats(99)
        self.assertIn("device 99", str(cm.exception))
        self.assertIsInstance(cm.exception, cachealloc.CacheallocError)
        with self.assertRaises(ValueError):
            cachealloc.memory_stats(-1)
        with self.assertRaises(RuntimeError):
            cachealloc.set_per_process_memory_fraction(1.5, fresh_device())

    @unittest.skipUnless(_lib.has_debug_hooks(), "the library has no test hooks (cargo feature debug-hooks)")
    def test_internal_error_is_a_runtime_error(self):
        d = fresh_device()
        self.assertEqual(_lib.lib().cachealloc_debug_force_internal_error(), 0)
        with quiet_stderr(), self.assertRaises(RuntimeError) as cm:  # the panic's report
            cachealloc.memory_stats(d)
        self.assertIn("internal error", str(cm.exception))
        cachealloc.memory_stats(d)  # and back to normal


class CachingAllocatorAlloc(unittest.TestCase):
    def test_alloc_and_delete(self):
        d = fresh_device()

        class Stream:  # what torch.cuda.Stream offers
            cuda_stream = 0x99

        p = cachealloc.caching_allocator_alloc(3 * MiB, device=d, stream=Stream())
        q = cachealloc.caching_allocator_alloc(1000, device="cuda:%d" % d)
        self.assertTrue(p and q and p != q)
        self.assertEqual(cachealloc.memory_allocated(d), 3 * MiB + 1024)
        snap = cachealloc.snapshot(device=d)
        streams = {s["address"]: s["stream"] for s in snap["segments"]}
        self.assertIn(0x99, streams.values())
        cachealloc.caching_allocator_delete(p)
        cachealloc.caching_allocator_delete(q)
        self.assertEqual(cachealloc.memory_allocated(d), 0)
        with self.assertRaises(cachealloc.CacheallocError):
            cachealloc.caching_allocator_delete(p)
        self.assertEqual(cachealloc.caching_allocator_alloc(0, device=d), 0)
        cachealloc.caching_allocator_delete(0)
        with self.assertRaisesRegex(RuntimeError, "out of memory"):
            cachealloc.caching_allocator_alloc(4 * GiB, device=d)

    def test_delete_of_a_bad_pointer_is_an_invalid_device_pointer(self):
        """As torch: a RuntimeError, "invalid device pointer: 0x...", here
        saying whether the address was freed already or never handed out."""
        d = fresh_device()
        p = cachealloc.caching_allocator_alloc(MiB, device=d)
        cachealloc.caching_allocator_delete(p)
        with self.assertRaises(cachealloc.CacheallocError) as cm:
            cachealloc.caching_allocator_delete(p)
        self.assertIsInstance(cm.exception, RuntimeError)
        self.assertNotIsInstance(cm.exception, cachealloc.OutOfMemoryError)
        self.assertIn("invalid device pointer: %#x" % p, str(cm.exception))
        self.assertIn("already freed", str(cm.exception))
        with self.assertRaises(cachealloc.CacheallocError) as cm:
            cachealloc.caching_allocator_delete(p + 512)
        self.assertIn("invalid device pointer: %#x" % (p + 512), str(cm.exception))
        self.assertIn("not an address caching_allocator_alloc returned", str(cm.exception))
        # Handed out again, the address frees once more, then is freed again.
        q = cachealloc.caching_allocator_alloc(MiB, device=d)
        self.assertEqual(q, p)  # the cached block
        cachealloc.caching_allocator_delete(q)
        with self.assertRaisesRegex(cachealloc.CacheallocError, "already freed"):
            cachealloc.caching_allocator_delete(q)
        self.assertEqual(cachealloc.memory_allocated(d), 0)

    def test_bad_sizes_are_refused_before_the_library(self):
        d = fresh_device()
        for size in (-1, -(1 << 64)):
            with self.assertRaisesRegex(ValueError, "size must not be negative, got %d" % size):
                cachealloc.caching_allocator_alloc(size, device=d)
        for size in (1.5, "1024", None, 2.0):
            with self.assertRaisesRegex(TypeError, "size must be an int"):
                cachealloc.caching_allocator_alloc(size, device=d)
        # More than a size_t holds (ctypes would wrap it to 0: NULL, no error).
        with self.assertRaisesRegex(ValueError, "more than a size_t holds"):
            cachealloc.caching_allocator_alloc(1 << 64, device=d)
        # The largest size_t overflows the allocator's rounding: an
        # out-of-memory (as torch says it), not a crash.
        with self.assertRaises(cachealloc.OutOfMemoryError) as cm:
            cachealloc.caching_allocator_alloc((1 << 64) - 1, device=d)
        self.assertIn("more than 1EB", str(cm.exception))
        self.assertIn("18446744073709551615 bytes requested", str(cm.exception))
        self.assertEqual(cachealloc.memory_stats(d)["allocation.all.current"], 0)


class HistoryAndSnapshot(unittest.TestCase):
    def test_snapshot_pickle_and_json(self):
        lib = _lib.lib()
        d = fresh_device()
        cachealloc.record_history(True, max_entries=1000, device=d)
        p = lib.cachealloc_alloc(5 * MiB, d, None)
        cachealloc.record_annotation("step 1", device=d)
        q = lib.cachealloc_alloc(1000, d, None)
        lib.cachealloc_free(q, 1000, d, None)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snap.pickle")
            self.assertIsNone(cachealloc.snapshot(path, device=d))
            with open(path, "rb") as f:
                snap = pickle.load(f)
            self.assertIn("segments", snap)
            self.assertIn("device_traces", snap)
            self.assertEqual({s["device"] for s in snap["segments"]}, {d})
            self.assertEqual(sum(s["total_size"] for s in snap["segments"]), 22 * MiB)
            traces = snap["device_traces"][d]
            actions = [t["action"] for t in traces]
            self.assertIn("alloc", actions)
            self.assertIn("free_requested", actions)
            self.assertIn("segment_alloc", actions)
            self.assertTrue(any(a.get("name") == "step 1" for a in snap.get("external_annotations", [])),
                            snap.get("external_annotations"))

            jpath = os.path.join(tmp, "snap.json")
            cachealloc.snapshot(jpath, device=d)
            with open(jpath, encoding="utf-8") as f:
                js = json.load(f)
            self.assertEqual(len(js["segments"]), len(snap["segments"]))

            with self.assertRaises(RuntimeError):
                cachealloc.snapshot(os.path.join(tmp, "no", "such", "dir.pickle"), device=d)
        self.assertEqual(cachealloc.snapshot(device=d)["segments"], snap["segments"])
        cachealloc.record_history(False, device=d)
        lib.cachealloc_free(p, 5 * MiB, d, None)


class OutOfMemory(unittest.TestCase):
    def test_out_of_memory_has_its_own_exception(self):
        self.assertIn("OutOfMemoryError", cachealloc.__all__)
        self.assertTrue(issubclass(cachealloc.OutOfMemoryError, cachealloc.CacheallocError))
        self.assertTrue(issubclass(cachealloc.OutOfMemoryError, RuntimeError))
        d = fresh_device()
        with self.assertRaises(cachealloc.OutOfMemoryError) as cm:
            cachealloc.caching_allocator_alloc(4 * GiB, device=d)
        self.assertIn("CUDA out of memory", str(cm.exception))
        self.assertEqual(_lib.last_error_code(), _lib.ERROR_OUT_OF_MEMORY)
        # Other failures are not out-of-memories.
        with self.assertRaises(cachealloc.CacheallocError) as cm:
            cachealloc.memory_stats(99)
        self.assertNotIsInstance(cm.exception, cachealloc.OutOfMemoryError)
        self.assertEqual(_lib.last_error_code(), _lib.ERROR_OTHER)
        # An out-of-memory of any call the package makes, as the library reports it.
        alloc = torch_style("cachealloc_alloc", _ALLOC_FN)
        self.assertIsNone(alloc(4 * GiB, d, None))
        self.assertIsInstance(_lib.fail("cachealloc_alloc"), cachealloc.OutOfMemoryError)

    def test_oom_gives_null_and_the_message(self):
        alloc = torch_style("cachealloc_alloc", _ALLOC_FN)
        d = fresh_device()
        seen = []
        cachealloc.attach_oom_observer(lambda *args: seen.append(args))
        self.assertIsNone(alloc(2 * GiB, d, None))
        msg = _lib.last_error()
        self.assertIn("out of memory", msg)
        # The message is per thread, and stays until the next call on this one.
        other = []
        t = threading.Thread(target=lambda: other.append(_lib.last_error()))
        t.start()
        t.join()
        self.assertEqual(other, [None])
        self.assertEqual(_lib.last_error(), msg)
        self.assertEqual(cachealloc.memory_stats(d)["num_ooms"], 1)
        self.assertIsNone(_lib.last_error())  # that call succeeded
        mine = [a for a in seen if a[0] == d]
        self.assertEqual(len(mine), 1, seen)
        self.assertEqual(mine[0][1], 2 * GiB)
        self.assertEqual(mine[0][2], GiB)


    def test_the_rejection_policy_tells_its_observers(self):
        # throw_on_cudamalloc_oom (torch 2.12 on): settings are read once per
        # process, so in a child of its own.
        code = r"""
import cachealloc
from cachealloc import _lib
seen = []
cachealloc.attach_oom_rejection_observer(lambda *a: seen.append(a))
cachealloc.attach_oom_observer(lambda *a: seen.append(("oom",) + a))
lib = _lib.lib()
assert lib.cachealloc_alloc(2 << 30, 0, None) is None
msg = _lib.last_error()
assert "preemptively rejected because it would exceed per_process_memory_fraction" in msg, msg
s = cachealloc.memory_stats(0)
assert (s["num_oom_rejections"], s["num_ooms"], s["num_device_alloc"]) == (1, 0, 0), s
assert seen == [(0, 2 << 30, 0, 1 << 30)], seen
print("ok: rejected, observed")
"""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   CACHEALLOC_BACKEND="mock", CACHEALLOC_MOCK_CAPACITY="1GiB",
                   CACHEALLOC_CONF="throw_on_cudamalloc_oom:True")
        env.pop("CACHEALLOC_TORCH_VERSION", None)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("ok: rejected, observed", r.stdout)

    def test_the_cause_names_the_class_and_the_bytes(self):
        alloc = torch_style("cachealloc_alloc", _ALLOC_FN)
        d = fresh_device()
        causes = []
        cachealloc.attach_oom_cause_observer(lambda device, cause: causes.append((device, cause)))
        keep = alloc(100 * MiB, d, None)
        self.assertIsNotNone(keep)
        self.assertIsNone(alloc(2 * GiB, d, None))
        msg = _lib.last_error()
        self.assertIn("cachealloc: capacity: ", msg)
        self.assertLess(msg.index("out of memory"), msg.index("cachealloc: capacity"))
        cause = cachealloc.last_oom_cause()
        self.assertEqual(cause["class"], "capacity")
        self.assertEqual((cause["needed"], cause["live_bytes"], cause["limit"]), (2 * GiB, 100 * MiB, GiB))
        mine = [c for dev, c in causes if dev == d]
        self.assertEqual(mine, [cause])
        f = cachealloc.memory_fragmentation(d)
        self.assertEqual(f["large_pool"]["allocated_bytes"], 100 * MiB)
        self.assertEqual(f["device"]["reserved_bytes"], cachealloc.memory_stats(d)["reserved_bytes.all.current"])
        self.assertEqual(cachealloc.pool_memory(device=d), f["large_pool"])
        with self.assertRaises(RuntimeError):
            cachealloc.pool_memory((7, 7), device=d)
        lib = _lib.lib()
        lib.cachealloc_free(keep, 100 * MiB, d, None)
        f = cachealloc.memory_fragmentation(d)
        self.assertEqual(f["large_pool"]["free_bytes"], 100 * MiB)
        self.assertEqual(f["stream_free_bytes"], 100 * MiB)
        self.assertEqual(f["device"]["external_fragmentation"], 0.0)

    def test_an_observer_may_call_back_into_the_failing_device(self):
        # Observers run once the device's lock is released (PyTorch's order):
        # one that reads memory_stats, records an annotation and allocates on
        # the device that just failed returns (it used to deadlock).
        d = fresh_device()
        seen = []

        def observer(device, alloc_size, device_total, device_free):
            if device != d:
                return
            stats = cachealloc.memory_stats(device)
            cachealloc.record_annotation("inside the OOM observer", device=device)
            p = cachealloc.caching_allocator_alloc(4096, device=device)
            cachealloc.caching_allocator_delete(p)
            seen.append(stats["num_ooms"])

        cachealloc.attach_oom_observer(observer)
        result = []
        t = threading.Thread(
            target=lambda: result.append(_lib.lib().cachealloc_alloc(2 * GiB, d, None)),
            daemon=True,
        )
        t.start()
        t.join(timeout=60)
        self.assertFalse(t.is_alive(), "deadlock: the observer never returned")
        self.assertEqual(result, [None])
        self.assertEqual(seen, [1], "it ran once and saw the OOM counted")
        self.assertEqual(cachealloc.memory_stats(d)["num_ooms"], 1)

    @unittest.skipUnless(_lib.has_debug_hooks(), "the library has no test hooks (cargo feature debug-hooks)")
    def test_a_panic_inside_a_device_lock_fails_that_device(self):
        # In a process of its own: a failed device stays failed, and the
        # calls on every device (empty_cache(-1)) would report it.
        code = r"""
import cachealloc
from cachealloc import _lib
lib = _lib.lib()
p = lib.cachealloc_alloc(1000, 1, None)
assert p is not None
assert lib.cachealloc_debug_fail_inside_lock() == 0
assert lib.cachealloc_alloc(1000, 1, None) is None
assert "internal error" in _lib.last_error(), _lib.last_error()
try:
    cachealloc.memory_stats(1)
    raise SystemExit("memory_stats of a failed device answered")
except RuntimeError as e:
    assert "device 1 failed" in str(e), e
assert lib.cachealloc_alloc(1000, 1, None) is None
assert "device 1 failed" in _lib.last_error()
q = lib.cachealloc_alloc(1000, 0, None)
assert q is not None, "device 0 works on"
lib.cachealloc_free(q, 1000, 0, None)
print("ok: device 1 failed, device 0 works")
"""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("ok: device 1 failed, device 0 works", r.stdout)


def fake_torch(cuda_available, initialized=False):
    """Stand-in torch, torch.cuda and torch.cuda.memory modules that record
    what install() does with them."""
    torch = types.ModuleType("torch")
    torch.__fake__ = True
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    torch.cuda = cuda
    cuda.memory = memory
    cuda.is_available = lambda: cuda_available
    cuda.is_initialized = lambda: initialized
    calls = []

    class Inner:
        pass

    for setter, _ in cachealloc.torch_glue.HOOKS:
        if setter != "set_release_pool":  # an older torch, without one of them
            setattr(Inner, setter, (lambda s: lambda self, addr: calls.append((s, addr)))(setter))

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_name, free_name):
            calls.append(("CUDAPluggableAllocator", path, alloc_name, free_name))
            self._inner = Inner()

        def allocator(self):
            return self._inner

    memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    memory.change_current_allocator = lambda a: calls.append(("change_current_allocator", a))
    modules = {"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory}
    return modules, calls


class Settings(unittest.TestCase):
    def run_code(self, code, **settings):
        """`code` in a fresh process on the simulated device with the
        settings variables `settings` (the rest cleared); it must exit 0."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   CACHEALLOC_BACKEND="mock")
        for v in ("CACHEALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                  "CACHEALLOC_TORCH_VERSION", "CACHEALLOC_MOCK_CAPACITY", "CACHEALLOC_SLOTS",
                  "CACHEALLOC_HISTORY_CAPACITY"):
            env.pop(v, None)
        env.update(settings)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r

    def run_with(self, **settings):
        """A fresh process with the settings variables `settings` (the rest
        cleared): what its first call raises."""
        code = ("import cachealloc\n"
                "try:\n"
                "    cachealloc.memory_stats(0)\n"
                "except cachealloc.CacheallocError as e:\n"
                "    print(e)\n")
        return self.run_code(code, **settings).stdout.strip()

    def test_a_bad_setting_names_its_variable(self):
        for var in ("CACHEALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
            msg = self.run_with(**{var: "expandable_segment:True"})
            self.assertIn('%s="expandable_segment:True": allocator config: option `expandable_segment`' % var, msg)
            self.assertIn("unknown option", msg)
            self.assertIn("did you mean `expandable_segments`?", msg)
        for var, value in (("CACHEALLOC_MOCK_CAPACITY", "lots"), ("CACHEALLOC_SLOTS", "0"),
                           ("CACHEALLOC_TORCH_VERSION", "latest"), ("CACHEALLOC_BACKEND", "tpu")):
            msg = self.run_with(**{var: value})
            self.assertIn('%s="%s": ' % (var, value), msg)


    def test_torchs_later_settings_reach_cachealloc(self):
        """``install()`` wraps torch's setter of a later settings string: a
        string torch's parser accepts reaches cachealloc, one it refuses
        raises as before and changes nothing (a stand-in ``torch._C``)."""
        code = ("import types, cachealloc\n"
                "from cachealloc import _lib, torch_glue\n"
                "def torchs(env):\n"
                "    if 'true' in env:\n"
                "        raise ValueError(\"Expected 'True' or 'False'\")\n"
                "torch = types.SimpleNamespace(_C=types.SimpleNamespace(_accelerator_setAllocatorSettings=torchs))\n"
                "torch_glue.follow_torch_settings(torch)\n"
                "torch_glue.follow_torch_settings(torch)  # idempotent\n"
                "def size():\n"
                "    before = cachealloc.memory_allocated(0)\n"
                "    assert _lib.lib().cachealloc_alloc(1100000, 0, None)\n"
                "    return cachealloc.memory_allocated(0) - before\n"
                "try:\n"
                "    torch._C._accelerator_setAllocatorSettings('roundup_power2_divisions:4,expandable_segments:true')\n"
                "except ValueError:\n"
                "    print('refused', size())\n"
                "torch._C._accelerator_setAllocatorSettings('roundup_power2_divisions:4')\n"
                "print('taken', size())\n")
        r = self.run_code(code)
        self.assertEqual(r.stdout.split(), ["refused", "1100288", "taken", "1310720"])

    def test_the_configured_fraction_from_the_start(self):
        """``per_process_memory_fraction:0.5`` reads back as 0.5 before the
        first allocation (torch sets it when the allocator is made); a
        fraction of 1.0 then sets no limit (an out-of-memory names no
        "allowed"), as torch 2.11 to 2.15 do."""
        code = ("import cachealloc\n"
                "print(cachealloc.get_per_process_memory_fraction(0))\n"
                "cachealloc.set_per_process_memory_fraction(1.0, 0)\n"
                "try:\n"
                "    cachealloc.caching_allocator_alloc(2 << 30, 0)\n"
                "except cachealloc.OutOfMemoryError as e:\n"
                "    print('allowed;' in str(e))\n")
        r = self.run_code(code, CACHEALLOC_MOCK_CAPACITY="1GiB", CACHEALLOC_CONF="per_process_memory_fraction:0.5")
        self.assertEqual(r.stdout.split(), ["0.5", "False"])

    def test_what_torch_reads_oddly_is_read_so_and_said(self):
        """``20MB`` is 20, as torch's ``stoull`` reads it: the settings
        start as under torch, and stderr says so once."""
        code = "import cachealloc\nprint(cachealloc.memory_stats(0)['max_split_size'])\n"
        r = self.run_code(code, CACHEALLOC_CONF="max_split_size_mb:20MB")
        self.assertEqual(r.stdout.strip(), str(20 << 20))
        self.assertEqual(r.stderr.count("cachealloc: warning: CACHEALLOC_CONF: `max_split_size_mb:20MB`"), 1,
                         r.stderr)

    def test_a_later_settings_string(self):
        """``set_allocator_settings`` (torch's ``_set_allocator_settings``)
        reaches the devices made before and after it, with torch's rules
        for a key it leaves out; a bad string changes nothing."""
        code = ("import cachealloc\n"
                "from cachealloc import _lib\n"
                "lib = _lib.lib()\n"
                "def size(d):\n"
                "    before = cachealloc.memory_allocated(d)\n"
                "    assert lib.cachealloc_alloc(1100000, d, None)\n"
                "    return cachealloc.memory_allocated(d) - before\n"
                "print(size(0))\n"
                "cachealloc.set_allocator_settings('roundup_power2_divisions:4')\n"
                "print(size(0), size(1))\n"
                "try:\n"
                "    cachealloc.set_allocator_settings('roundup_power2_divisions:3')\n"
                "except cachealloc.CacheallocError as e:\n"
                "    print(e)\n"
                "print(size(0))\n"
                "cachealloc.set_allocator_settings('max_split_size_mb:40')\n"
                "print(size(0), size(2))\n")
        r = self.run_code(code)
        lines = r.stdout.strip().splitlines()
        # 512-byte rounding; a quarter of a MiB on devices old and new; the
        # bad string refused, nothing changed; a later string without the
        # divisions resets them, as torch's parser does.
        self.assertEqual(lines[0], "1100288")
        self.assertEqual(lines[1], "1310720 1310720")
        self.assertIn('cachealloc_set_allocator_settings("roundup_power2_divisions:3")', lines[2])
        self.assertIn("the divisions has to be power of 2", lines[2])
        self.assertEqual(lines[3], "1310720")
        self.assertEqual(lines[4], "1100288 1100288")


class Install(unittest.TestCase):
    def test_without_torch_raises_import_error_naming_torch(self):
        with mock.patch.dict(sys.modules, {"torch": None, "torch.cuda": None, "torch.cuda.memory": None}):
            with self.assertRaises(ImportError) as cm:
                cachealloc.install()
        self.assertIn("torch", str(cm.exception))
        self.assertFalse(cachealloc.installed())

    def test_without_cuda_raises_runtime_error(self):
        modules, calls = fake_torch(cuda_available=False)
        with mock.patch.dict(sys.modules, modules):
            with self.assertRaises(RuntimeError) as cm:
                cachealloc.install()
        self.assertIn("is_available", str(cm.exception))
        self.assertEqual(calls, [])
        self.assertFalse(cachealloc.installed())

    def test_after_cuda_init_or_on_the_mock_raises_runtime_error(self):
        modules, calls = fake_torch(cuda_available=True, initialized=True)
        with mock.patch.dict(os.environ, {"CACHEALLOC_BACKEND": "cuda"}), mock.patch.dict(sys.modules, modules):
            with self.assertRaisesRegex(RuntimeError, "before any CUDA use"):
                cachealloc.install()
        modules, calls = fake_torch(cuda_available=True)
        with mock.patch.dict(sys.modules, modules):
            with self.assertRaisesRegex(RuntimeError, "mock"):
                cachealloc.install()
        self.assertEqual(calls, [])

    def test_with_cuda_sets_every_hook_then_swaps(self):
        from cachealloc import torch_glue

        modules, calls = fake_torch(cuda_available=True)
        # The library read CACHEALLOC_BACKEND=mock already: it is said to run on CUDA.
        with mock.patch.dict(os.environ, {"CACHEALLOC_BACKEND": "cuda"}), mock.patch.dict(sys.modules, modules), \
                mock.patch.object(_lib, "backend", lambda: "cuda"), \
                mock.patch.object(torch_glue, "_INSTALLED", None), mock.patch.object(torch_glue, "_MODE", None):
            a = cachealloc.install(native=False)
            self.assertIs(cachealloc.install(), a)  # once
            self.assertTrue(cachealloc.installed())
            self.assertEqual(cachealloc.install_mode(), "pluggable")
        # The pluggable path's alloc aborts on a failure rather than hand torch a NULL.
        self.assertEqual(calls[0], ("CUDAPluggableAllocator", cachealloc.library_path(),
                                    "cachealloc_pluggable_alloc", "cachealloc_free"))
        handle = ctypes.CDLL(cachealloc.library_path())
        expected = [(setter, ctypes.cast(getattr(handle, c_name), c_void_p).value)
                    for setter, c_name in torch_glue.HOOKS if setter != "set_release_pool"]
        self.assertEqual(calls[1:-1], expected)
        self.assertEqual(calls[-1], ("change_current_allocator", a))
        self.assertFalse(cachealloc.installed())

    def test_without_a_native_build_falls_back_with_a_warning(self):
        """The fake torch is no CUDA build the native allocator can be built
        against: install() warns, naming what is lost, and takes the
        pluggable path."""
        from cachealloc import torch_glue

        modules, calls = fake_torch(cuda_available=True)
        with mock.patch.dict(os.environ, {"CACHEALLOC_BACKEND": "cuda"}), mock.patch.dict(sys.modules, modules), \
                mock.patch.object(_lib, "backend", lambda: "cuda"), \
                mock.patch.object(torch_glue, "_INSTALLED", None), mock.patch.object(torch_glue, "_MODE", None):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                a = cachealloc.install()
            self.assertEqual(cachealloc.install_mode(), "pluggable")
        self.assertTrue(all(x.category is RuntimeWarning for x in w), w)
        text = "\n".join(str(x.message) for x in w)
        # The fake torch has no headers either: the raising entry cannot
        # be built, and install() says what that costs.
        for lost in ("native allocator could not be built", "not a CUDA build", "torch.cuda.memory_stats()",
                     "_dump_snapshot", "cudnn.benchmark", "torch.multiprocessing",
                     "aborts the process", "pluggable.cpp"):
            self.assertIn(lost, text)
        self.assertEqual(calls[0][2], "cachealloc_pluggable_alloc")
        self.assertEqual(calls[-1], ("change_current_allocator", a))

    def test_without_a_compiler_the_build_says_so(self):
        """No C++ compiler: the native build fails with a BuildError that
        names it (install() then falls back, as above)."""
        from cachealloc import native

        with mock.patch.dict(os.environ, {"CXX": "/nonexistent/c++"}):
            self.assertIsNone(native.compiler())
            with self.assertRaisesRegex(native.BuildError, "no C\\+\\+ compiler"):
                native.command(types.SimpleNamespace(__file__="/nowhere/torch/__init__.py"), "/tmp/x.so")

    def test_real_torch_without_cuda(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        if torch.cuda.is_available():
            self.skipTest("CUDA is available: installing would change this process's allocator")
        with self.assertRaises(RuntimeError):
            cachealloc.install()

    def test_real_torch_takes_every_hook(self):
        """A CUDA build of torch, no GPU: in a child process (the swap is for
        the process's life) install() with is_available forced true. Real
        torch must accept the library, have every setter of HOOKS, and then
        refuse a second swap, since its allocator is now ours."""
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        if not hasattr(torch._C, "_cuda_customAllocator"):
            self.skipTest("this torch has no CUDA support (CUDAPluggableAllocator needs one)")
        child = (
            "import torch, cachealloc\n"
            "from cachealloc import torch_glue\n"
            "torch.cuda.is_available = lambda: True\n"
            "a = cachealloc.install(native=False)\n"
            "assert cachealloc.install_mode() == 'pluggable'\n"
            "inner = a.allocator()\n"
            "missing = [s for s, _ in torch_glue.HOOKS if not hasattr(inner, s)]\n"
            "assert not missing, missing\n"
            "try:\n"
            "    torch.cuda.memory.change_current_allocator(a)\n"
            "    raise SystemExit('a second swap was accepted')\n"
            "except RuntimeError as e:\n"
            "    assert 'already initialized' in str(e), e\n"
            "print('hooks', len(torch_glue.HOOKS), 'torch', torch.__version__)\n"
        )
        env = dict(os.environ, CACHEALLOC_BACKEND="cuda", PYTHONWARNINGS="ignore")
        r = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("hooks 8", r.stdout)

    def test_real_torch_takes_the_native_allocator(self):
        """The same with the native allocator (built against this torch, in
        a cache of the test's own): torch's current allocator is
        cachealloc's (torch names it by its name(): "cachealloc"). Like
        torch's own, it counts as initialised (a swap refused) from CUDA's
        initialisation on, which needs a GPU."""
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        if not getattr(torch.version, "cuda", None):
            self.skipTest("this torch has no CUDA support")
        from cachealloc import native

        if native.compiler() is None:
            self.skipTest("no C++ compiler")
        child = (
            "import torch, cachealloc\n"
            "torch.cuda.is_available = lambda: True\n"
            "cachealloc.install()\n"
            "assert cachealloc.install_mode() == 'native', cachealloc.install_mode()\n"
            "assert torch._C._cuda_getAllocatorBackend() == 'cachealloc'\n"
            "assert cachealloc.install() is cachealloc.install()\n"
            "print('native', torch.__version__)\n"
        )
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, CACHEALLOC_BACKEND="cuda", CACHEALLOC_CACHE=cache)
            r = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True,
                               timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("native", r.stdout)


#: The HIP stub runtime's sources (tests/stubs), from this file.
STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "stubs")

#: A ROCm build of torch, as far as install() sees one: torch.version.hip
#: set, and a CUDAPluggableAllocator whose functions the child calls as
#: torch's hooks would.
#: What the child processes' stand-in torch modules share: torch,
#: torch.cuda (available, not initialised) and torch.cuda.memory, and the
#: pluggable allocator's inner object, whose hook setters take anything.
STAND_IN_MODULES = r"""
import ctypes, os, sys, types, warnings
torch = types.ModuleType("torch")
cuda = types.ModuleType("torch.cuda")
memory = types.ModuleType("torch.cuda.memory")
torch.cuda, cuda.memory = cuda, memory
cuda.is_available = lambda: True
cuda.is_initialized = lambda: False

class Inner:
    def __getattr__(self, name):
        if name.startswith("set_"):
            return lambda address: None
        raise AttributeError(name)

"""

FAKE_ROCM_TORCH = STAND_IN_MODULES + r"""
torch.__version__ = "2.11.0+rocm6.4"
torch.version = types.SimpleNamespace(hip="6.4.43482-0f2d60242", cuda=None)
installed = []

class CUDAPluggableAllocator:
    def __init__(self, path, alloc_name, free_name):
        lib = ctypes.CDLL(path)
        self.alloc = getattr(lib, alloc_name)
        self.alloc.restype, self.alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.free = getattr(lib, free_name)
        self.free.restype = None
        self.free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.names = (alloc_name, free_name)
    def allocator(self):
        return Inner()

memory.CUDAPluggableAllocator = CUDAPluggableAllocator
memory.change_current_allocator = installed.append
sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory})

import cachealloc
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    a = cachealloc.install()
assert installed == [a], installed
assert cachealloc.install_mode() == "pluggable", cachealloc.install_mode()
assert any("ROCm build of torch" in str(x.message) for x in w), [str(x.message) for x in w]
assert cachealloc.backend() == "hip", cachealloc.backend()
stats = cachealloc.memory_stats(0)
assert stats["max_split_size"] == 64 << 20, stats["max_split_size"]
p = a.alloc(3 << 20, 0, None)  # torch's allocate, on the current stream
assert p, "no pointer"
assert cachealloc.memory_allocated(0) == 3 << 20
a.free(p, 3 << 20, 0, None)
assert cachealloc.memory_allocated(0) == 0
assert cachealloc.memory_stats(0)["num_device_alloc"] == 1
print("rocm torch: hip backend, PYTORCH_HIP_ALLOC_CONF read, %s / %s on the HIP stub" % a.names)
"""


#: A torch whose pluggable allocation is built by native.py's machinery
#: against stand-in c10 headers (stand_in_torch/include) and called as
#: torch's C++ calls it: through stand_in_torch/call_alloc.cpp, which
#: catches what it throws and reports the kind, for the Python side to
#: raise torch.OutOfMemoryError as torch's binding does. argv: "hip" or
#: "cuda", then "oom" (a request beyond the device) or "rejection" (the
#: same, refused by throw_on_cudamalloc_oom before any device call).
STAND_IN_TORCH = STAND_IN_MODULES + r"""
kind, case = sys.argv[1], sys.argv[2]
torch.__file__ = os.path.join(os.environ["STAND_IN_TORCH"], "__init__.py")
if kind == "hip":
    torch.__version__ = "2.14.0+rocm6.4"
    torch.version = types.SimpleNamespace(hip="6.4.43482-0f2d60242", cuda=None)
else:
    torch.__version__ = "2.14.0+cu130"
    torch.version = types.SimpleNamespace(hip=None, cuda="13.0")

class OutOfMemoryError(RuntimeError):
    pass

torch.OutOfMemoryError = OutOfMemoryError
call = ctypes.CDLL(os.environ["STAND_IN_CALL"])
call.stand_in_alloc.restype = ctypes.c_int
call.stand_in_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]

class CUDAPluggableAllocator:
    def __init__(self, path, alloc_name, free_name):
        lib = ctypes.CDLL(path)
        self.alloc_fn = ctypes.cast(getattr(lib, alloc_name), ctypes.c_void_p).value
        self.free = getattr(lib, free_name)
        self.free.restype = None
        self.free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        self.names = (alloc_name, free_name)
    def alloc(self, size, device, stream):
        out, msg = ctypes.c_void_p(), ctypes.create_string_buffer(16384)
        k = call.stand_in_alloc(self.alloc_fn, size, device, stream, ctypes.byref(out), msg, len(msg))
        if k == 1:
            raise torch.OutOfMemoryError(msg.value.decode())
        if k:
            raise RuntimeError(msg.value.decode())
        return out.value
    def allocator(self):
        return Inner()

memory.CUDAPluggableAllocator = CUDAPluggableAllocator
memory.change_current_allocator = lambda a: None
sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory})

import cachealloc
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    a = cachealloc.install()
assert cachealloc.install_mode() == "pluggable", cachealloc.install_mode()
assert a.names == ("cachealloc_torch_pluggable_alloc", "cachealloc_torch_pluggable_free"), a.names
assert not any("aborts the process" in str(x.message) for x in w), [str(x.message) for x in w]
assert cachealloc.backend() == kind, cachealloc.backend()
p = a.alloc(3 << 20, 0, None)
before = cachealloc.memory_allocated(0)
try:
    a.alloc(2 << 30, 0, None)  # beyond the device's 1 GiB
except torch.OutOfMemoryError as e:
    print("%s %s: torch.OutOfMemoryError: %s" % (kind, case, str(e).splitlines()[0]))
else:
    raise AssertionError("no torch.OutOfMemoryError")
assert cachealloc.memory_allocated(0) == before, (cachealloc.memory_allocated(0), before)
stats = cachealloc.memory_stats(0)
counted = stats["num_ooms"] if case == "oom" else stats["num_oom_rejections"]
assert counted == 1, stats
a.free(p, 3 << 20, 0, None)
assert cachealloc.memory_allocated(0) == 0
print("%s %s: the process lives, memory_allocated unchanged" % (kind, case))
"""


class PluggableOutOfMemory(unittest.TestCase):
    def test_an_out_of_memory_and_a_rejection_raise_torch_out_of_memory_error(self):
        """On torch's pluggable path (a ROCm torch, and a CUDA torch whose
        native build failed), with a compiler: the allocation entry built
        against torch's c10 raises c10::OutOfMemoryError, which torch turns
        into torch.OutOfMemoryError, for an out-of-memory and for a
        rejection of throw_on_cudamalloc_oom; the process lives. On the
        project's HIP and CUDA stub drivers, with a stand-in torch."""
        from cachealloc import native

        cxx, cc = native.compiler(), os.environ.get("CC", "cc")
        if cxx is None:
            self.skipTest("no C++ compiler")
        here = os.path.dirname(os.path.abspath(__file__))
        stand_in = os.path.join(here, "stand_in_torch")
        with tempfile.TemporaryDirectory() as d:
            def build(cmd):
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    self.skipTest("cannot build %s here: %s" % (cmd[-1], (r.stderr or r.stdout)[-400:]))

            torch_dir = os.path.join(d, "torch")
            os.makedirs(os.path.join(torch_dir, "lib"))
            os.symlink(os.path.join(stand_in, "include"), os.path.join(torch_dir, "include"))
            empty = os.path.join(d, "empty.c")
            with open(empty, "w") as f:
                f.write("int stand_in_c10;\n")
            build([cc, "-shared", "-fPIC", "-o", os.path.join(torch_dir, "lib", "libc10.so"), empty])
            caller = os.path.join(d, "stand_in_call.so")
            build([cxx, "-std=c++17", "-shared", "-fPIC", "-I", os.path.join(stand_in, "include"),
                   "-o", caller, os.path.join(stand_in, "call_alloc.cpp")])
            hip = os.path.join(d, "libamdhip64.so.5")
            build([cc, "-shared", "-fPIC", "-O1", "-std=c11", "-D_GNU_SOURCE", "-pthread", "-fvisibility=hidden",
                   "-Wl,-soname,libamdhip64.so.5", "-Wl,--version-script=" + os.path.join(STUBS, "hip.map"),
                   "-o", hip, os.path.join(STUBS, "hip_stub.c")])
            cuda_dir = os.path.join(d, "cuda")
            os.makedirs(cuda_dir)
            build([cc, "-shared", "-fPIC", "-O1", "-std=c11", "-D_GNU_SOURCE", "-pthread",
                   "-Wl,-soname,libcuda.so.1", "-o", os.path.join(cuda_dir, "libcuda.so.1"),
                   os.path.join(STUBS, "cuda_stub.c")])
            for kind in ("hip", "cuda"):
                for case in ("oom", "rejection"):
                    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                               STAND_IN_TORCH=torch_dir, STAND_IN_CALL=caller,
                               CACHEALLOC_CACHE=os.path.join(d, "cache"), CACHEALLOC_HIP_LIBRARY=hip,
                               LD_LIBRARY_PATH=cuda_dir if kind == "cuda" else d,
                               CACHEALLOC_MOCK_CAPACITY="1GiB")
                    for v in ("CACHEALLOC_BACKEND", "CACHEALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                              "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CACHEALLOC_TORCH_VERSION"):
                        env.pop(v, None)
                    conf = "PYTORCH_HIP_ALLOC_CONF" if kind == "hip" else "PYTORCH_CUDA_ALLOC_CONF"
                    env[conf] = "throw_on_cudamalloc_oom:True" if case == "rejection" else "max_split_size_mb:64"
                    env["CACHEALLOC_STUB_CAPACITY"] = str(1 << 30)
                    r = subprocess.run([sys.executable, "-c", STAND_IN_TORCH, kind, case], env=env,
                                       capture_output=True, text=True, timeout=120)
                    self.assertEqual(r.returncode, 0, "%s %s:\n%s%s" % (kind, case, r.stdout, r.stderr))
                    self.assertIn("%s %s: torch.OutOfMemoryError" % (kind, case), r.stdout)
                    self.assertIn("%s %s: the process lives" % (kind, case), r.stdout)


class RocmTorch(unittest.TestCase):
    def test_a_rocm_build_of_torch_runs_on_hip(self):
        """install() under a ROCm build of torch (a stand-in module, in a
        child process on the project's HIP stub runtime, built here):
        the HIP backend, torch's ROCm settings variable, the pluggable path
        (saying why), an allocation and a free through torch's hooks."""
        cc = os.environ.get("CC", "cc")
        with tempfile.TemporaryDirectory() as d:
            so = os.path.join(d, "libamdhip64.so.5")
            r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-std=c11", "-D_GNU_SOURCE", "-pthread",
                                "-fvisibility=hidden", "-Wl,-soname,libamdhip64.so.5",
                                "-Wl,--version-script=" + os.path.join(STUBS, "hip.map"),
                                "-o", so, os.path.join(STUBS, "hip_stub.c")], capture_output=True, text=True)
            if r.returncode != 0:
                self.skipTest("cannot build the HIP stub here: %s" % (r.stderr or r.stdout)[-300:])
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                       LD_LIBRARY_PATH=d, PYTORCH_HIP_ALLOC_CONF="max_split_size_mb:64")
            for v in ("CACHEALLOC_BACKEND", "CACHEALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                      "CACHEALLOC_TORCH_VERSION"):
                env.pop(v, None)
            env["CACHEALLOC_HIP_LIBRARY"] = so  # the stub, not a ROCm this machine may have
            r = subprocess.run([sys.executable, "-c", FAKE_ROCM_TORCH], env=env, capture_output=True, text=True,
                               timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("rocm torch: hip backend", r.stdout)

    def test_a_rocm_build_of_torch_refuses_the_cuda_backend(self):
        modules, calls = fake_torch(cuda_available=True)
        modules["torch"].version = types.SimpleNamespace(hip="6.4.43482", cuda=None)
        with mock.patch.dict(os.environ, {"CACHEALLOC_BACKEND": "cuda"}), mock.patch.dict(sys.modules, modules):
            with self.assertRaisesRegex(RuntimeError, "ROCm build.*CACHEALLOC_BACKEND=cuda.*set hip"):
                cachealloc.install()
        self.assertEqual(calls, [])


if __name__ == "__main__":
    unittest.main()

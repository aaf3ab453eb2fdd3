"""cachealloc's C++ allocator for torch (cachealloc/native/allocator.cpp),
built against the torch of the running Python and driven directly on the
simulated device by native_driver.cpp: no GPU needed.

Skips, saying why, where the running Python has no CUDA build of torch or
there is no C++ compiler (CI installs no torch). To run it with a torch
installed in another environment:

    /path/to/venv/bin/python -m unittest python/tests/test_native.py -v
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    from cachealloc import native  # the installed package (python/ci-check.sh)
except ImportError:  # run from a source checkout
    sys.path.insert(0, os.path.dirname(HERE))
    from cachealloc import native

#: Where the package imported here lives (for child processes).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(native.__file__)))

try:
    import torch

    SKIP = None if torch.version.cuda else "torch %s is not a CUDA build" % torch.__version__
except ImportError:
    torch = None
    SKIP = "torch is not installed in this Python (%s)" % sys.executable
if SKIP is None and native.compiler() is None:
    SKIP = "no C++ compiler"


def mock_env(extra=None):
    env = dict(os.environ)
    for v in ("CACHEALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "CACHEALLOC_SLOTS", "CACHEALLOC_HISTORY_CAPACITY"):
        env.pop(v, None)
    env.update(
        CACHEALLOC_BACKEND="mock",
        CACHEALLOC_MOCK_CAPACITY="1GiB",
        CACHEALLOC_CONF="max_split_size_mb:64",
        # The keys and decisions of the torch under test (install() sets it).
        CACHEALLOC_TORCH_VERSION=torch.__version__ if torch is not None else "",
    )
    env.update(extra or {})
    return env


@unittest.skipIf(SKIP is not None, "skipped: %s" % SKIP)
class NativeAllocator(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        os.environ.setdefault("CACHEALLOC_CACHE", os.path.join(cls.tmp.name, "cache"))
        cls.library = native.build()
        cls.driver = os.path.join(cls.tmp.name, "native_driver")
        cmd = native.command(torch, cls.driver, os.path.join(HERE, "native_driver.cpp"), executable=True)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        if proc.returncode != 0:
            raise AssertionError("compiling native_driver.cpp failed:\n" + proc.stdout[-6000:])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_library_builds_against_this_torch(self):
        self.assertTrue(os.path.isfile(self.library))
        self.assertIn(torch.__version__.replace("+", "_"), os.path.basename(self.library))
        # Cached: a second build is the same file, not a new compile.
        self.assertEqual(native.build(), self.library)

    def test_driver_on_the_simulated_device(self):
        snap = os.path.join(self.tmp.name, "snap.json")
        proc = subprocess.run(
            [self.driver, snap], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            universal_newlines=True, env=mock_env(), timeout=120,
        )
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out)
        self.assertIn("native_driver: all checks passed", out)
        for line in proc.stdout.splitlines():
            if line.startswith("ok "):
                print(line)
        # snapshot()'s segments and blocks equal cachealloc's snapshot file.
        torch_segments = []
        for line in proc.stdout.splitlines():
            if line.startswith("segment "):
                f = line.split()
                blocks = [tuple(b.split(":")) for b in f[8:]]
                torch_segments.append((
                    int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5]), f[6] == "1", int(f[7]),
                    [(int(s), int(r), st) for s, r, st in blocks],
                ))
        with open(snap) as fh:
            d = json.load(fh)
        ours = [
            (s["address"], s["total_size"], s["allocated_size"], s["active_size"], s["requested_size"],
             s["segment_type"] == "large", s["device"],
             [(b["size"], b["requested_size"], b["state"]) for b in s["blocks"]])
            for s in d["segments"]
        ]
        self.assertTrue(ours, "cachealloc's snapshot has segments")
        self.assertEqual(torch_segments, ours)
        # The history's entries, times in microseconds as cachealloc's file has them.
        actions = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                   "segment_map", "segment_unmap", "snapshot", "oom"]
        torch_traces = [
            (actions[int(f[1])], int(f[2]), int(f[3]), int(f[4]))
            for f in (line.split() for line in proc.stdout.splitlines() if line.startswith("trace "))
        ]
        file_traces = [(e["action"], e["addr"], e["size"], e["time_us"]) for e in d["device_traces"][0]]
        self.assertTrue(torch_traces)
        self.assertEqual(torch_traces, file_traces[:len(torch_traces)])
        print("ok snapshot() gives the %d segments and %d blocks of cachealloc's snapshot" % (
            len(ours), sum(len(s[7]) for s in ours)))

    def test_torch_reaches_it_through_its_own_functions(self):
        """In a process of its own: the native allocator installed into torch
        (cachealloc.native.install()), then torch's own Python functions
        (torch.cuda.memory_stats, memory_summary, max_memory_allocated,
        reset_peak_memory_stats, _snapshot, the memory fraction) on the
        simulated device. Without a GPU torch thinks CUDA was never
        initialised and returns {} from memory_stats: that check is patched
        (torch.cuda.memory.is_initialized) so its code runs as on a GPU."""
        script = r'''
import json, sys, pickle
import torch, torch.cuda.memory as tm
import cachealloc
from cachealloc import native
native.install()
assert torch._C._cuda_getAllocatorBackend() == "cachealloc", torch._C._cuda_getAllocatorBackend()
tm.is_initialized = lambda: True
# torch's _record_memory_history initialises CUDA first (no GPU here): the
# history is turned on through cachealloc's, the same C function.
cachealloc.record_history(True)
ptrs = [cachealloc.caching_allocator_alloc(n << 20) for n in (1, 3, 25)]
cachealloc.caching_allocator_delete(ptrs[1])
# One allocation in a private pool (this thread's requests routed there).
torch._C._cuda_beginAllocateCurrentThreadToPool(0, (0, 9))
ptrs.append(cachealloc.caching_allocator_alloc(2 << 20))
torch._C._cuda_endAllocateToPool(0, (0, 9))
ours = dict(cachealloc.memory_stats(0))
theirs = dict(torch.cuda.memory_stats(0))
assert all(ours[k] == theirs.get(k) for k in ours), sorted(k for k in ours if ours[k] != theirs.get(k))
# Keys of newer torch versions that cachealloc has no counter for: 0, as
# torch's own allocator reports them without the policy behind them.
extra = set(theirs) - set(ours)
assert extra <= {"num_oom_rejections"} and all(theirs[k] == 0 for k in extra), extra
assert torch.cuda.max_memory_allocated(0) == ours["allocated_bytes.all.peak"]
summary = torch.cuda.memory_summary(0)
assert "PyTorch CUDA memory summary" in summary, summary[:200]
torch.cuda.reset_peak_memory_stats(0)
assert torch.cuda.memory_stats(0)["allocated_bytes.all.peak"] == ours["allocated_bytes.all.current"]
snap = torch.cuda.memory._snapshot()
cachealloc.snapshot(sys.argv[1])
mine = json.load(open(sys.argv[1]))
key = lambda s: (s["address"], s["total_size"], s["allocated_size"], [(b["size"], b["state"]) for b in s["blocks"]])
assert [key(s) for s in snap["segments"]] == [key(s) for s in mine["segments"]]
allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
assert len(allocs) == 4, allocs
# From torch 2.12 trace entries name their pool (torch serializes the
# TraceEntry's mempool the native allocator filled in).
if "pool_id" in allocs[0]:
    assert [tuple(e["pool_id"]) for e in allocs] == [(0, 0)] * 3 + [(0, 9)], allocs
    pools = "each naming its pool"
else:
    assert torch.__version__ < "2.12", torch.__version__
    pools = "no pool_id before torch 2.12"
assert snap["allocator_settings"]["max_split_size"] == 64 << 20, snap["allocator_settings"]
# The memory fraction reads back through torch whichever front end set it
# (torch.cuda.get/set_per_process_memory_fraction call these two after
# initialising CUDA, which this machine has not).
cachealloc.set_per_process_memory_fraction(0.5, 0)
assert torch._C._cuda_getMemoryFraction(0) == 0.5, torch._C._cuda_getMemoryFraction(0)
torch._C._cuda_setMemoryFraction(0.25, 0)
assert cachealloc.get_per_process_memory_fraction(0) == 0.25
assert torch._C._cuda_getMemoryFraction(0) == 0.25
# A later settings string given to torch reaches cachealloc once torch's
# parser accepted it: the next segment is expandable, and the snapshot's
# settings say so; a string torch refuses changes nothing.
import warnings
warnings.simplefilter("ignore", FutureWarning)  # _set_allocator_settings is deprecated in favour of the next
try:
    torch.cuda.memory._set_allocator_settings("expandable_segments:true")
except Exception as e:
    assert "True" in str(e), e
else:
    raise AssertionError("torch took a misspelt boolean")
torch.cuda.memory._set_allocator_settings("expandable_segments:True")
ptrs.append(cachealloc.caching_allocator_alloc(30 << 20))
later = torch.cuda.memory._snapshot()
assert later["allocator_settings"]["expandable_segments"], later["allocator_settings"]
# torch names the string in force PYTORCH_CUDA_ALLOC_CONF; max_split_size
# went back to its default, as torch's later-string rule has it.
assert "expandable_segments:True" in later["allocator_settings"].values(), later["allocator_settings"]
assert later["allocator_settings"]["max_split_size"] != 64 << 20, later["allocator_settings"]
new = [s for s in later["segments"] if s.get("is_expandable")]
assert len(new) == 1 and new[0]["blocks"][0]["size"] == 30 << 20, later["segments"]
torch._C._accelerator_setAllocatorSettings("expandable_segments:False")
assert not torch.cuda.memory._snapshot()["allocator_settings"]["expandable_segments"]
print("torch.cuda.memory_stats: %d keys equal; memory_summary, max_memory_allocated, "
      "reset_peak_memory_stats; _snapshot: %d segments equal, %d allocs in the history (%s); "
      "the memory fraction reads back through torch; torch's _set_allocator_settings reaches it"
      % (len(theirs), len(snap["segments"]), len(allocs), pools))
'''
        snap = os.path.join(self.tmp.name, "torch-snap.json")
        proc = subprocess.run(
            [sys.executable, "-c", script, snap], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            universal_newlines=True, env=dict(mock_env(), PYTHONPATH=PACKAGE_ROOT), timeout=180,
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        print("ok " + proc.stdout.strip().splitlines()[-1])

    def test_the_memory_fraction_as_torch_has_it(self):
        """Under the native allocator in torch: the configured fraction reads
        back right after start-up (torch sets it when the allocator is
        made), and a fraction of 1.0 sets no limit: an out-of-memory then
        names no "allowed" (torch 2.11 to 2.15's setMemoryFraction)."""
        script = r'''
import torch, cachealloc
from cachealloc import native
native.install()
assert torch._C._cuda_getMemoryFraction(0) == 0.5, torch._C._cuda_getMemoryFraction(0)
torch._C._cuda_setMemoryFraction(1.0, 0)
assert torch._C._cuda_getMemoryFraction(0) == 1.0
# (torch's raw_alloc needs a CUDA runtime; the allocation the C++ makes
# is cachealloc_alloc, whose message it throws.)
try:
    cachealloc.caching_allocator_alloc(2 << 30, 0)
except cachealloc.OutOfMemoryError as e:
    message = str(e)
else:
    raise AssertionError("2 GiB on a 1 GiB device")
assert "out of memory" in message and "allowed;" not in message, message
print("the configured fraction reads back at start-up; 1.0 sets no limit")
'''
        env = dict(mock_env({"CACHEALLOC_CONF": "per_process_memory_fraction:0.5"}), PYTHONPATH=PACKAGE_ROOT)
        proc = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, env=env, timeout=180)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        print("ok " + proc.stdout.strip().splitlines()[-1])

    def test_torchs_own_settings_parser_gives_the_checked_in_answers(self):
        """torch's own parser (scripts/torch_parser/probe.cpp, built against
        this torch) reads every string of tests/data/torch_parser/strings.txt
        as the answers checked in for its release say; the Rust test
        torch_parser.rs compares those answers with cachealloc's parser. A
        release whose parser changed fails here until the answers are made
        again (scripts/torch-parser.sh)."""
        root = os.path.dirname(os.path.dirname(HERE))
        data = os.path.join(root, "tests", "data", "torch_parser")
        minor = int(torch.__version__.split(".")[1])
        answers = os.path.join(data, "torch-2.%d.jsonl" % minor)
        if not os.path.isfile(answers):
            self.skipTest("no answers checked in for torch 2.%d" % minor)
        probe = os.path.join(self.tmp.name, "probe")
        cmd = native.command(torch, probe, os.path.join(root, "scripts", "torch_parser", "probe.cpp"),
                             executable=True) + ["-DTORCH_MINOR=%d" % minor, "-w"]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        self.assertEqual(proc.returncode, 0, "compiling probe.cpp failed:\n" + proc.stdout[-4000:])
        env = dict(os.environ)
        for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
            env.pop(v, None)
        with open(os.path.join(data, "strings.txt"), encoding="utf-8") as f:
            run = subprocess.run([probe], stdin=f, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, env=env, timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr[-2000:])
        ours = [json.loads(line) for line in run.stdout.splitlines()]
        with open(answers, encoding="utf-8") as f:
            checked_in = [json.loads(line) for line in f]
        # The messages name the source line torch was built at: compare the rest.
        strip = lambda rs: [{k: v for k, v in r.items() if k != "error"} for r in rs]
        self.assertEqual(strip(ours), strip(checked_in))
        print("ok torch %s's own parser: %d strings read as the checked-in answers say"
              % (torch.__version__, len(ours)))


if __name__ == "__main__":
    unittest.main()

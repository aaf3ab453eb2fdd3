#!/usr/bin/env python3
"""The GPU check: a matrix of PyTorch workloads, each run in a process of its
own on PyTorch's native allocator and again with cachealloc installed
(``cachealloc.install()``), comparing the results and every
``memory_stats()`` key. Needs an NVIDIA GPU, a CUDA build of torch and the
cachealloc package with a library built with ``--features cuda`` (the
default); not run by CI. One command, about 3 minutes on one GPU and 16
cores (the processes run ``--jobs`` at a time, 8 by default):

    python3 python/tests/gpu_check.py --out gpu-summary.json --status-md gpu-status.md
    python3 python/tests/gpu_check.py --only graph,oom_fraction   # a few

It prints a table and writes one JSON summary (``--out``): per workload its
status, the keys that differ (and which may, with why), the result
comparison and the time taken; ``--status-md`` writes the same as the
markdown rows of the README's status table's GPU column (device, torch,
date, commit from ``$GPUCHECK_COMMIT``). Exit status 1 if a workload fails that is
not a known failure (``expect``: why it is known to fail), 0 otherwise.

Keys allowed to differ, and why:
- ``two_streams``: the device calls and the cache's shape depend on when
  the producer stream's events complete, which changes run to run on a
  real GPU (seen on an H200: 25 vs 27 segments between two runs); only the
  results and the allocation counts are compared.
- every workload: none otherwise. With cachealloc installed (natively),
  the statistics are torch's own ``torch.cuda.memory_stats()``, checked
  equal to ``cachealloc.memory_stats()`` in the same process.

Before the matrix, the native allocator is built once
(``cachealloc.native.build()``) into ``$CACHEALLOC_CACHE``, so the workers
load it from the cache.

The module imports without torch (``--list`` prints the matrix).
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import time

MIB = 1 << 20

# Keys whose values depend on event timing between streams.
EVENT_TIMING = (
    "num_device_alloc",
    "num_device_free",
    "num_sync_all_streams",
    "segment.",
    "reserved_bytes.",
    "inactive_split.",
    "inactive_split_bytes.",
    "oversize_segments.",
    "requested_bytes.",
    "active.",
    "active_bytes.",
    "max_split_size",
)


def _timing_key(key):
    return any(key == p or key.startswith(p) for p in EVENT_TIMING)


# ----------------------------------------------------------------- workloads
#
# Each takes (torch, device) and returns a flat list of floats (what must be
# equal between the two allocators). Deterministic: fixed seeds, no
# benchmark-mode autotuning unless that is the point.


def _step(opt, loss, losses):
    """One optimizer step on `loss`, kept in `losses`."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())


def _seed(torch):
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def mlp(torch, dev):
    _seed(torch)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
        torch.nn.Linear(2048, 10),
    ).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for step in range(5):
        g = torch.Generator(device=dev).manual_seed(step)
        x = torch.randn(256, 512, device=dev, generator=g)
        y = torch.randint(0, 10, (256,), device=dev, generator=g)
        _step(opt, torch.nn.functional.cross_entropy(model(x), y), losses)
    return losses


def _convnet(torch):
    nn = torch.nn

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(
        block(3, 32), block(32, 64), nn.MaxPool2d(2),
        block(64, 128), block(128, 128), nn.MaxPool2d(2),
        block(128, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10),
    )


def _train_conv(torch, dev):
    model = _convnet(torch).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(6):
        g = torch.Generator(device=dev).manual_seed(step)
        x = torch.randn(64, 3, 64, 64, device=dev, generator=g).to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (64,), device=dev, generator=g)
        _step(opt, torch.nn.functional.cross_entropy(model(x), y), losses)
    return losses


def conv(torch, dev):
    _seed(torch)
    return _train_conv(torch, dev)


def conv_benchmark(torch, dev):
    """cuDNN's algorithm search asks the allocator for its largest cached
    block (cacheInfo), which a pluggable allocator refuses."""
    _seed(torch)
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True
    losses = _train_conv(torch, dev)
    return [round(v, 2) for v in losses]  # benchmark picks algorithms: compare coarsely


def _encoder(torch, d=256, layers=4):
    layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def transformer(torch, dev):
    """A GPT-2-style training loop whose sequence lengths vary step to step."""
    _seed(torch)
    vocab, d = 1000, 256
    emb = torch.nn.Embedding(vocab, d).to(dev)
    enc = _encoder(torch, d).to(dev)
    head = torch.nn.Linear(d, vocab).to(dev)
    params = list(emb.parameters()) + list(enc.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    losses = []
    for step, seq in enumerate([64, 128, 96, 200, 32, 160, 128, 64]):
        g = torch.Generator(device=dev).manual_seed(step)
        tok = torch.randint(0, vocab, (8, seq + 1), device=dev, generator=g)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(seq, device=dev)
        h = enc(emb(tok[:, :-1]), mask=mask, is_causal=True)
        _step(opt, torch.nn.functional.cross_entropy(head(h).reshape(-1, vocab), tok[:, 1:].reshape(-1)), losses)
    return losses


def generate(torch, dev):
    """Greedy generation: the sequence (and every activation) grows a token
    at a time."""
    _seed(torch)
    vocab, d = 1000, 256
    emb = torch.nn.Embedding(vocab, d).to(dev).eval()
    enc = _encoder(torch, d, 3).to(dev).eval()
    head = torch.nn.Linear(d, vocab).to(dev).eval()
    tok = torch.randint(0, vocab, (4, 8), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
    with torch.no_grad():
        for _ in range(48):
            n = tok.shape[1]
            mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=dev)
            logits = head(enc(emb(tok), mask=mask, is_causal=True)[:, -1])
            tok = torch.cat([tok, logits.argmax(-1, keepdim=True)], dim=1)
    return [float(t) for t in tok[:, -16:].flatten().tolist()]


def two_streams(torch, dev):
    """A producer stream fills buffers that the main stream's matmuls read;
    each buffer is freed (record_stream) while they may still run, and the
    producer asks for the memory again at once."""
    _seed(torch)
    side = torch.cuda.Stream(device=dev)
    w = torch.randn(2048, 2048, device=dev)
    acc = torch.zeros(2048, 2048, device=dev)
    for step in range(20):
        with torch.cuda.stream(side):
            x = torch.full((2048, 2048), float(step % 7) / 7.0, device=dev)
        torch.cuda.current_stream(dev).wait_stream(side)
        acc += x @ w
        x.record_stream(torch.cuda.current_stream(dev))
        del x
    torch.cuda.synchronize(dev)
    return [acc.sum().item(), acc.abs().max().item()]


def graph(torch, dev):
    """torch.cuda.graph around a small model's forward (warm-up on a side
    stream as PyTorch's docs do), replayed with new inputs: equal to eager."""
    _seed(torch)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)
    ).to(dev).eval()
    static_in = torch.randn(64, 512, device=dev)
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream(dev).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        static_out = model(static_in)
    out = []
    for k in range(3):
        x = torch.randn(64, 512, device=dev, generator=torch.Generator(device=dev).manual_seed(10 + k))
        static_in.copy_(x)
        g.replay()
        with torch.no_grad():
            eager = model(x)
        torch.cuda.synchronize(dev)
        if not torch.allclose(static_out, eager, rtol=1e-5, atol=1e-5):
            raise RuntimeError("the graph's replay differs from eager execution")
        out.append(static_out.sum().item())
    del g
    return out


def graph_stream_reuse(torch, dev):
    """A capture that forks a second stream, which uses blocks of the
    capture stream (record_stream) and is joined back before they are
    freed, eight times over: with graph_capture_record_stream_reuse:True
    the later requests take the freed blocks within the capture (the
    graph pool stays small); the replay equals eager execution."""
    side = torch.cuda.Stream(device=dev)
    g = torch.cuda.CUDAGraph()
    base = torch.ones(4 * MIB, dtype=torch.float32, device=dev)
    with torch.cuda.graph(g):
        cap = torch.cuda.current_stream(dev)
        acc = torch.zeros_like(base)
        for k in range(8):
            x = base * (k + 1)
            side.wait_stream(cap)
            with torch.cuda.stream(side):
                y = x * 2
                x.record_stream(side)
            cap.wait_stream(side)
            acc += y
            del x, y
    g.replay()
    torch.cuda.synchronize(dev)
    want = float(2 * sum(range(1, 9)) * base.numel())
    got = float(acc.sum().item())
    if got != want:
        raise RuntimeError("the graph's replay gives %r, eager %r" % (got, want))
    del g
    return [got]


# A pool allocator for torch.cuda.MemPool(allocator=...): cudaMalloc and
# cudaFree of the CUDA runtime torch loaded, its calls counted. Compiled at
# run time with the C compiler (the device machine has gcc, no Rust).
_POOL_ALLOCATOR_C = r"""
#include <dlfcn.h>
#include <stddef.h>
typedef int (*malloc_t)(void **, size_t);
typedef int (*free_t)(void *);
long pool_allocs = 0, pool_frees = 0;
void *pool_alloc(size_t size, int device, void *stream) {
    (void)device; (void)stream;
    malloc_t m = (malloc_t)dlsym(RTLD_DEFAULT, "cudaMalloc");
    void *p = NULL;
    if (!m || m(&p, size) != 0) return NULL;
    pool_allocs++;
    return p;
}
void pool_free(void *ptr, size_t size, int device, void *stream) {
    (void)size; (void)device; (void)stream;
    free_t f = (free_t)dlsym(RTLD_DEFAULT, "cudaFree");
    if (f) f(ptr);
    pool_frees++;
}
"""


def _pool_allocator(torch):
    """The compiled pool allocator: (torch's CUDAPluggableAllocator, the
    ctypes library whose pool_allocs / pool_frees count its calls)."""
    import ctypes
    import tempfile

    d = tempfile.mkdtemp(prefix="gpucheck-pool-")
    src, lib = os.path.join(d, "pool.c"), os.path.join(d, "pool.so")
    with open(src, "w") as f:
        f.write(_POOL_ALLOCATOR_C)
    subprocess.check_call(["gcc", "-shared", "-fPIC", "-O1", src, "-o", lib, "-ldl"])
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "pool_alloc", "pool_free")
    return alloc, ctypes.CDLL(lib)


def mempool_allocator(torch, dev):
    """torch.cuda.MemPool(allocator=...): the pool's segments come from a
    pluggable allocator (cudaMalloc, counted), its blocks are reused, and
    dropping the pool gives them back to it."""
    import ctypes

    alloc, lib = _pool_allocator(torch)
    pool = torch.cuda.MemPool(alloc.allocator())
    with torch.cuda.use_mem_pool(pool):
        a = torch.ones(3 * MIB, device=dev)
        b = torch.ones(5 * MIB // 4, device=dev)
        c = a + b[: 3 * MIB].sum()
        del a
        d = torch.ones(2 * MIB, device=dev)  # from the cache
    out = float(c.sum().item()) + float(d.sum().item())
    allocs = ctypes.c_long.in_dll(lib, "pool_allocs").value
    use = pool.use_count()
    del b, c, d
    del pool
    torch.cuda.empty_cache()
    frees = ctypes.c_long.in_dll(lib, "pool_frees").value
    return [out, float(allocs), float(frees), float(use)]


def resize_with_addr(torch, dev):
    """UntypedStorage._resize_with_addr_ (torch 2.13 on): a storage rebuilt
    at 6 MiB into a freed 20 MiB block, and the error at a live address."""
    probe = torch.empty(0, dtype=torch.uint8, device=dev).untyped_storage()
    if not hasattr(probe, "_resize_with_addr_"):
        return ["no _resize_with_addr_ in torch %s" % torch.__version__]
    x = torch.empty(4 * MIB, dtype=torch.uint8, device=dev)
    base = x.data_ptr()
    del x
    t = torch.empty(0, dtype=torch.uint8, device=dev)
    t.untyped_storage()._resize_with_addr_(3 * MIB, base + 6 * MIB)
    at = t.untyped_storage().data_ptr() - base
    u = torch.empty(0, dtype=torch.uint8, device=dev)
    try:
        u.untyped_storage()._resize_with_addr_(MIB, base + 7 * MIB)
        live = "no error"
    except RuntimeError as e:
        live = str(e).splitlines()[0].split(" 0x")[0]
    del t
    return [float(at), live]


def graph_side_pool(torch, dev):
    """A use_mem_pool(side) inside torch.cuda.graph(g, pool=p): the side
    pool's use counts (torch 2.14 on: the graph retains it), where the
    tensors land, and what del side before del g leaves."""
    p = torch.cuda.MemPool()
    side = torch.cuda.MemPool()
    g = torch.cuda.CUDAGraph()
    x = torch.ones(MIB, device=dev)
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        for _ in range(2):
            (x * 2).sum()
    torch.cuda.current_stream(dev).wait_stream(s)
    with torch.cuda.graph(g, pool=p.id):
        with torch.cuda.use_mem_pool(side):
            inside = side.use_count()
            y = x * 3
        z = y + 1
    g.replay()
    torch.cuda.synchronize(dev)
    counts = [float(inside), float(side.use_count()), float(p.use_count())]
    out = float(z.sum().item())
    side_id = side.id
    del side
    reserved_side = float(torch.cuda.memory_stats(0).get(
        "reserved_bytes_by_private_pools.%d_%d.all.current" % side_id, -1))
    del g, y, z
    torch.cuda.empty_cache()
    return counts + [out, reserved_side, float(p.use_count())]


def compile_reduce_overhead(torch, dev):
    """torch.compile(mode="reduce-overhead"): CUDA graphs through cudagraph
    trees (private pools)."""
    _seed(torch)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).to(dev).eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    out = []
    with torch.no_grad():
        for k in range(6):
            x = torch.randn(32, 256, device=dev, generator=torch.Generator(device=dev).manual_seed(k))
            y = compiled(x).clone()
            if not torch.allclose(y, model(x), rtol=1e-4, atol=1e-4):
                raise RuntimeError("the compiled model differs from eager execution")
            out.append(round(y.sum().item(), 3))
    torch.cuda.synchronize(dev)
    return out


def oom_fraction(torch, dev):
    """256 MiB at a time under a memory fraction of 0.05 until it fails:
    torch.OutOfMemoryError; then free, empty the cache and go on."""
    torch.cuda.set_per_process_memory_fraction(0.05, dev)
    held, raised = [], None
    for _ in range(10000):
        try:
            t = torch.empty(256 * MIB, dtype=torch.uint8, device=dev)
        except torch.OutOfMemoryError as e:
            raised = str(e).splitlines()[0]
            break
        if t.data_ptr() == 0:
            raise RuntimeError("torch.empty returned a tensor at address 0 after %d allocations "
                               "(the allocator's NULL was not turned into an exception)" % len(held))
        held.append(t)
    if raised is None:
        raise RuntimeError("no out-of-memory under a memory fraction of 0.05")
    n = len(held)
    del held
    torch.cuda.empty_cache()
    again = torch.ones(64 * MIB, dtype=torch.uint8, device=dev)  # recovery
    return [float(n), float(again.sum().item())]


def mid_sizes(torch, dev):
    """Tensors of 2 to 9 MiB (the requests a large_segment_size_mb segment
    serves), every other one freed, then more of them: run with
    large_segment_size_mb:12."""
    held, total = [], 0.0
    for i in range(48):
        held.append(torch.ones((2 + i % 8) * MIB, dtype=torch.uint8, device=dev))
    for t in held[::2]:
        total += float(t.sum().item())
    del held[::2]
    for i in range(24):
        held.append(torch.ones((3 + i % 5) * MIB, dtype=torch.uint8, device=dev))
    total += sum(float(t.sum().item()) for t in held)
    return [total]


def config_fraction(torch, dev):
    """Under per_process_memory_fraction:0.05 (the setting, applied when
    the allocator starts): 256 MiB tensors until one runs out of memory,
    all freed, empty_cache, a 64 MiB tensor and its sum; twice."""
    out = []
    for _ in range(2):
        held = []
        try:
            for _ in range(10000):
                held.append(torch.empty(256 * MIB, dtype=torch.uint8, device=dev))
        except torch.OutOfMemoryError:
            pass
        out.append(float(len(held)))
        del held
        torch.cuda.empty_cache()
        t = torch.ones(64 * MIB, dtype=torch.uint8, device=dev)
        out.append(float(t.sum().item()))
        del t
    return out


def rejection(torch, dev):
    """throw_on_cudamalloc_oom:True (torch 2.12 on): a request beyond the
    device is refused before any device call (num_oom_rejections, no
    device malloc, no num_ooms) with torch's message, and the process goes
    on. The torch here may be older: cachealloc takes 2.12's decisions
    (CACHEALLOC_TORCH_VERSION), and checks itself."""
    small = torch.ones(MIB, dtype=torch.uint8, device=dev)
    before = torch.cuda.memory_stats(0).get("num_device_alloc", 0)
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device=dev)
        raise RuntimeError("a 1 PiB tensor was allocated")
    except torch.OutOfMemoryError as e:
        msg = str(e)
    if "preemptively rejected" not in msg:
        raise RuntimeError("not the rejection's message: %s" % msg.splitlines()[0])
    import cachealloc

    s = dict(cachealloc.memory_stats(0))
    if (s.get("num_oom_rejections"), s.get("num_ooms"), s.get("num_device_alloc")) != (1, 0, before):
        raise RuntimeError("rejections %s, ooms %s, device mallocs %s (before %s)" % (
            s.get("num_oom_rejections"), s.get("num_ooms"), s.get("num_device_alloc"), before))
    return [float(small.sum().item()), 1.0]


def fraction_readback(torch, dev):
    """torch.cuda.get_per_process_memory_fraction reads back the fraction
    set through torch, and with cachealloc installed the one set through
    cachealloc's own function: the C library keeps the limit, and torch's
    getter reads it there."""
    torch.cuda.set_per_process_memory_fraction(0.5, dev)
    through_torch = torch.cuda.get_per_process_memory_fraction(dev)
    if os.environ.get("GPUCHECK_BACKEND") == "cachealloc":
        import cachealloc

        cachealloc.set_per_process_memory_fraction(0.25, dev.index)
    else:
        torch.cuda.set_per_process_memory_fraction(0.25, dev)
    other = torch.cuda.get_per_process_memory_fraction(dev)
    if (through_torch, other) != (0.5, 0.25):
        raise RuntimeError("the fraction reads back as %s, %s (set 0.5, 0.25)" % (through_torch, other))
    torch.cuda.set_per_process_memory_fraction(1.0, dev)
    return [through_torch, other]


def snapshot_dump(torch, dev):
    """torch's own history and snapshot: _record_memory_history, a few steps,
    _dump_snapshot, read back with pickle."""
    import pickle
    import tempfile

    torch.cuda.memory._record_memory_history(max_entries=10000)
    losses = mlp(torch, dev)
    path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    traces = snap["device_traces"][0]
    allocs = sum(1 for e in traces if e["action"] == "alloc")
    if not snap["segments"] or not allocs:
        raise RuntimeError("an empty snapshot: %d segments, %d allocs" % (len(snap["segments"]), allocs))
    blocks = sum(len(s["blocks"]) for s in snap["segments"])
    return losses + [float(len(snap["segments"])), float(blocks), float(allocs)]


def _ipc_child(queue, done, backend):
    import torch

    if backend == "cachealloc":
        import cachealloc

        cachealloc.install()
    t = queue.get()
    done.put([float(t.sum().item()), float(t.numel())])
    del t
    torch.cuda.synchronize()


def _ipc(torch, dev, child_backend):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_ipc_child, args=(queue, done, child_backend))
    p.start()
    t = torch.arange(1 << 20, dtype=torch.float32, device=dev) * 0.5
    queue.put(t)
    got = done.get(timeout=90)
    p.join(60)
    if p.exitcode != 0:
        raise RuntimeError("the child exited with %s" % p.exitcode)
    return got + [float(t.sum().item())]


def ipc(torch, dev):
    """A CUDA tensor sent to a child process (torch.multiprocessing, spawn)
    on the same allocator as the parent, read back there."""
    backend = "cachealloc" if os.environ.get("GPUCHECK_BACKEND") == "cachealloc" else "native"
    return _ipc(torch, dev, backend)


def ipc_to_native(torch, dev):
    """The same, the child always on torch's own allocator (it opens
    cachealloc's handle with torch's code)."""
    return _ipc(torch, dev, "native")


# name -> (function, CACHEALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF, keys allowed
# to differ (a predicate) and why, why it is known to fail (or None))
WORKLOADS = [
    ("mlp", mlp, "", None, None),
    ("conv", conv, "", None, None),
    ("conv_benchmark", conv_benchmark, "", None, None),
    ("transformer", transformer, "", None, None),
    ("generate", generate, "", None, None),
    ("two_streams", two_streams, "", (_timing_key, "event timing between streams varies run to run"), None),
    ("graph", graph, "", None, None),
    ("compile_reduce_overhead", compile_reduce_overhead, "", None, None),
    ("oom_fraction", oom_fraction, "", None, None),
    ("fraction_readback", fraction_readback, "", None, None),
    ("snapshot_dump", snapshot_dump, "", None, None),
    ("ipc", ipc, "", None, None),
    ("ipc_to_native", ipc_to_native, "", None, None),
    # A tensor of an expandable segment: torch's 'e' handle (the pages'
    # file descriptors, taken by the child with pidfd_getfd).
    ("ipc_expandable", ipc, "expandable_segments:True", None, None),
    ("ipc_expandable_to_native", ipc_to_native, "expandable_segments:True", None, None),
    ("mlp_expandable", mlp, "expandable_segments:True", None, None),
    ("transformer_expandable", transformer, "expandable_segments:True", None, None),
    ("graph_expandable", graph, "expandable_segments:True", None, None),
    ("graph_stream_reuse", graph_stream_reuse, "graph_capture_record_stream_reuse:True", None, None),
    ("mempool_allocator", mempool_allocator, "", None, None),
    ("mempool_allocator_expandable", mempool_allocator, "expandable_segments:True", None, None),
    ("resize_with_addr", resize_with_addr, "", None, None),
    ("graph_side_pool", graph_side_pool, "", None, None),
    ("mid_sizes_large_segment", mid_sizes, "large_segment_size_mb:12", None, None),
    ("config_fraction", config_fraction, "per_process_memory_fraction:0.05", None, None),
    ("rejection", rejection, "throw_on_cudamalloc_oom:True", None,
     "torch 2.11 has no throw_on_cudamalloc_oom (its native run fails at the setting); "
     "cachealloc's run checks itself under 2.12's decisions"),
]


# ------------------------------------------------------------------ worker


def worker(name, backend):
    """Run one workload in this process: a JSON line with its result, the
    statistics and the time, or the error."""
    fn = dict((w[0], w[1]) for w in WORKLOADS)[name]
    t0 = time.time()
    import torch

    os.environ["GPUCHECK_BACKEND"] = backend
    line = {"workload": name, "backend": backend, "torch": torch.__version__}
    if backend == "cachealloc":
        import cachealloc

        cachealloc.install()
        line["install_mode"] = cachealloc.install_mode()
    dev = torch.device("cuda", 0)
    try:
        result = fn(torch, dev)
        torch.cuda.synchronize(dev)
        line["result"] = result
        line["ok"] = True
    except BaseException as e:  # report, never hang
        line["ok"] = False
        line["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    try:
        line["stats"] = dict(torch.cuda.memory_stats(0))
        if backend == "cachealloc":
            import cachealloc

            own = dict(cachealloc.memory_stats(0))
            # Every key torch reports, as cachealloc reports it (cachealloc
            # may name more: the keys of a later torch it was told to take).
            differ = sorted(k for k in line["stats"] if own.get(k, 0) != line["stats"][k])
            if differ:
                line["ok"] = False
                line["error"] = "torch.cuda.memory_stats() differs from cachealloc.memory_stats() in %s" % differ[:5]
            line["library"] = cachealloc.library_path()
        line["device"] = torch.cuda.get_device_name(0)
    except BaseException as e:
        line["stats_error"] = "%s: %s" % (type(e).__name__, e)
    line["seconds"] = round(time.time() - t0, 2)
    print("GPUCHECK " + json.dumps(line), flush=True)
    return 0


def run_one(name, backend, conf, timeout):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("CACHEALLOC_CONF", None)
    if backend == "cachealloc":
        env["CACHEALLOC_BACKEND"] = "cuda"
        env["CACHEALLOC_CONF"] = conf
        if name == "rejection":
            env.setdefault("CACHEALLOC_TORCH_VERSION", "2.12")
    elif conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--backend", backend]
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timed out after %d s" % timeout}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("GPUCHECK "):
            return json.loads(line[len("GPUCHECK "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"ok": False, "error": "exit %d without a result: %s" % (p.returncode, " | ".join(tail))}


def _close(a, b):
    if a is None or b is None or len(a) != len(b):
        return False
    return all(abs(x - y) <= 1e-5 * max(1.0, abs(x), abs(y)) for x, y in zip(a, b))


def compare(name, conf, allowed, expect, native, ours):
    """One row of the summary."""
    row = {"workload": name, "conf": conf,
           "native_seconds": native.get("seconds"), "cachealloc_seconds": ours.get("seconds"),
           "native_error": native.get("error"), "cachealloc_error": ours.get("error")}
    problems = []
    if not native.get("ok"):
        problems.append("native run failed: %s" % native.get("error"))
    if not ours.get("ok"):
        problems.append("cachealloc run failed: %s" % ours.get("error"))
    if native.get("ok") and ours.get("ok"):
        row["results_equal"] = _close(native.get("result"), ours.get("result"))
        if not row["results_equal"]:
            problems.append("results differ: %s vs %s" % (native.get("result"), ours.get("result")))
    a, b = native.get("stats") or {}, ours.get("stats") or {}
    keys = sorted(set(a) | set(b))
    differ, tolerated = {}, {}
    for k in keys:
        if a.get(k) != b.get(k):
            if allowed is not None and allowed[0](k):
                tolerated[k] = [b.get(k), a.get(k)]
            else:
                differ[k] = [b.get(k), a.get(k)]
    row["keys_compared"] = len(keys)
    row["keys_differ"] = differ  # key: [cachealloc, native]
    if allowed is not None:
        row["keys_allowed_to_differ"] = {"differing": tolerated, "why": allowed[1]}
    if keys and differ and native.get("ok") and ours.get("ok"):
        problems.append("%d memory_stats keys differ" % len(differ))
    if not keys:
        problems.append("no statistics (%s / %s)" % (native.get("stats_error"), ours.get("stats_error")))
    row["problems"] = problems
    if expect:
        row["expected_failure"] = expect
        row["status"] = "expected-failure" if problems else "unexpected-pass"
    else:
        row["status"] = "fail" if problems else "pass"
    return row


def status_markdown(summary):
    """The GPU column of the README's status table: one line of where and
    when, then a row per workload."""
    out = ["%s, torch %s, %s, commit %s, `%s` path: %d passed, %d failed, %d expected failures (%s s)\n" % (
        summary.get("device"), summary.get("torch"), summary.get("date"), summary.get("commit") or "unknown",
        summary.get("install_mode"), summary["passed"], summary["failed"], summary["expected_failures"],
        summary["seconds"]),
        "| workload | settings | status | memory_stats keys equal | native s | cachealloc s |",
        "| --- | --- | --- | ---: | ---: | ---: |"]
    for r in summary["workloads"]:
        out.append("| %s | %s | %s | %d of %d | %s | %s |" % (
            r["workload"], r["conf"] or "(default)", r["status"] + (": " + "; ".join(r["problems"])[:120].replace("|", "/") if r["problems"] else ""),
            r["keys_compared"] - len(r["keys_differ"]), r["keys_compared"],
            r.get("native_seconds"), r.get("cachealloc_seconds")))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker")
    ap.add_argument("--backend", choices=["native", "cachealloc"])
    ap.add_argument("--out", help="the JSON summary")
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--list", action="store_true", help="print the matrix and exit")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per process")
    ap.add_argument("--jobs", type=int, default=min(8, max(1, (os.cpu_count() or 2) // 2)),
                    help="processes at once (each workload runs twice: native and cachealloc)")
    ap.add_argument("--status-md", help="the GPU column of the README's status table, as markdown")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.backend)
    names = [w[0] for w in WORKLOADS]
    chosen = args.only.split(",") if args.only else names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        ap.error("unknown workloads %s (known: %s)" % (unknown, ", ".join(names)))
    if args.list:
        for name, _, conf, allowed, expect in WORKLOADS:
            print("%-24s conf=%-26r%s%s" % (name, conf, " allowed: " + allowed[1] if allowed else "",
                                           " expect: " + expect if expect else ""))
        return 0
    t0 = time.time()
    try:  # build the native allocator once, outside the timed workers
        from cachealloc import native

        built = native.build(verbose=True)
        print("native allocator: %s (%.1f s)" % (built, time.time() - t0), flush=True)
    except Exception as e:  # noqa: BLE001 - reported; the workers fall back and say so
        print("native allocator NOT built: %s" % e, flush=True)
    rows = []
    chosen_rows = [w for w in WORKLOADS if w[0] in chosen]
    # Every process of the matrix, --jobs at a time: the workloads share the
    # GPU (each takes little of it) and the statistics compared are each
    # process's own.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = {(name, backend): pool.submit(run_one, name, backend, conf, args.timeout)
                for name, _, conf, _, _ in chosen_rows for backend in ("native", "cachealloc")}
        meta = {}
        for name, _, conf, allowed, expect in chosen_rows:
            native, ours = runs[(name, "native")].result(), runs[(name, "cachealloc")].result()
            row = compare(name, conf, allowed, expect, native, ours)
            rows.append(row)
            secs = lambda v: "-" if v is None else "%.1fs" % v  # noqa: E731
            print("%-28s %-17s native %6s  cachealloc %6s  %d keys, %d differ  %s" % (
                name, row["status"], secs(row["native_seconds"]), secs(row["cachealloc_seconds"]),
                row["keys_compared"], len(row["keys_differ"]), "; ".join(row["problems"])[:160]), flush=True)
            if not meta.get("device"):
                meta = ours if ours.get("device") else native
    summary = {
        "device": meta.get("device") if rows else None,
        "install_mode": meta.get("install_mode") if rows else None,
        "torch": meta.get("torch") if rows else None,
        "library": meta.get("library") if rows else None,
        "seconds": round(time.time() - t0, 1),
        "passed": sum(r["status"] == "pass" for r in rows),
        "failed": sum(r["status"] == "fail" for r in rows),
        "expected_failures": sum(r["status"] == "expected-failure" for r in rows),
        "unexpected_passes": sum(r["status"] == "unexpected-pass" for r in rows),
        "workloads": rows,
    }
    print("gpu_check: %(passed)d passed, %(failed)d failed, %(expected_failures)d expected failures, "
          "%(unexpected_passes)d unexpected passes in %(seconds)s s" % summary)
    summary["commit"] = os.environ.get("GPUCHECK_COMMIT")
    summary["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
    if args.status_md:
        with open(args.status_md, "w") as f:
            f.write(status_markdown(summary))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

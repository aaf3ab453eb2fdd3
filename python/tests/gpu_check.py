#!/usr/bin/env python3
"""On a machine with an NVIDIA GPU and torch (not run by CI): train a tiny
MLP a few steps with cachealloc installed as torch's allocator, then the same
in a fresh process on PyTorch's native allocator, and compare the statistics
that must agree if cachealloc is PyTorch's allocator: num_device_alloc
(cudaMalloc calls) and reserved_bytes.all.peak. Exit 1 on a mismatch.

    pip install dist/cachealloc-*.whl      # and a CUDA build of torch
    CACHEALLOC_BACKEND=cuda python3 python/tests/gpu_check.py

The allocator settings are CACHEALLOC_CONF (else PYTORCH_CUDA_ALLOC_CONF);
the native run is given the same string as PYTORCH_CUDA_ALLOC_CONF.
"""

import json
import os
import subprocess
import sys

STEPS = 5
COMPARED = ["num_device_alloc", "reserved_bytes.all.peak"]
SHOWN = COMPARED + [
    "num_device_free",
    "allocated_bytes.all.peak",
    "allocation.all.allocated",
    "segment.all.peak",
    "num_alloc_retries",
    "num_ooms",
]


def train(torch):
    """A few deterministic steps of a small MLP; the losses."""
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda", 0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 10),
    ).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        g = torch.Generator(device=dev).manual_seed(step)
        x = torch.randn(256, 512, device=dev, generator=g)
        y = torch.randint(0, 10, (256,), device=dev, generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return losses


def run_native():
    """The workload on PyTorch's own allocator: a JSON line."""
    import torch

    losses = train(torch)
    stats = torch.cuda.memory_stats(0)
    print(json.dumps({"losses": losses, "stats": {k: stats.get(k) for k in SHOWN}}))


def run_cachealloc():
    """The workload with cachealloc installed: the stats, by key."""
    import torch

    import cachealloc

    cachealloc.install()
    losses = train(torch)
    stats = cachealloc.memory_stats(0)
    print("cachealloc %s (%s), torch %s, %s" % (
        cachealloc.version(), cachealloc.library_path(), torch.__version__, torch.cuda.get_device_name(0)))
    print("cachealloc: num_device_alloc = %d, reserved_bytes.all.peak = %d" % (
        stats["num_device_alloc"], stats["reserved_bytes.all.peak"]))
    try:  # PyTorch's own statistics are gone with a pluggable allocator
        torch.cuda.memory_stats(0)
        print("note: torch.cuda.memory_stats() did not raise with cachealloc installed")
    except RuntimeError as e:
        print("as expected, torch.cuda.memory_stats() raises: %s" % str(e).splitlines()[0])
    torch.cuda.empty_cache()  # through the reset hook
    print("after torch.cuda.empty_cache(): reserved %d bytes" % cachealloc.memory_reserved(0))
    print(cachealloc.memory_summary(0, abbreviated=True))
    return losses, {k: stats.get(k) for k in SHOWN}


def main():
    if "--native" in sys.argv[1:]:
        run_native()
        return 0
    os.environ.setdefault("CACHEALLOC_BACKEND", "cuda")
    if os.environ["CACHEALLOC_BACKEND"].lower() != "cuda":
        print("gpu_check: needs CACHEALLOC_BACKEND=cuda", file=sys.stderr)
        return 2
    losses, ours = run_cachealloc()

    env = dict(os.environ)
    conf = env.pop("CACHEALLOC_CONF", None)
    if conf is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--native"], env=env,
                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    native = json.loads(out.strip().splitlines()[-1])
    theirs = native["stats"]

    print("%-28s %16s %16s" % ("key", "cachealloc", "torch native"))
    bad = []
    for k in SHOWN:
        mark = ""
        if k in COMPARED and ours[k] != theirs[k]:
            bad.append(k)
            mark = "  MISMATCH"
        print("%-28s %16s %16s%s" % (k, ours[k], theirs[k], mark))
    if losses != native["losses"]:
        print("note: the losses differ (%s vs %s)" % (losses, native["losses"]))
    else:
        print("losses identical over %d steps (last %.6f)" % (STEPS, losses[-1]))
    if bad:
        print("gpu_check: FAIL: %s differ" % ", ".join(bad))
        return 1
    print("gpu_check: ok: %s agree" % " and ".join(COMPARED))
    return 0


if __name__ == "__main__":
    sys.exit(main())

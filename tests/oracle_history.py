#!/usr/bin/env python3
"""Run the reference model with its memory history on, for many traces in
one process: the same `replay` function its command line calls, with every
allocator recording every trace entry, and its snapshot at the end.

usage: oracle_history.py ORACLE_DIR JOBS.jsonl SCRATCH_DIR
Each job line: {"path": ..., "conf": ..., "capacity": int|null, "memory_fraction": float|null}
Each output line: {"ok": snapshot} or {"error": "..."}
"""
import json
import os
import sys

sys.path.insert(0, sys.argv[1])
import pytorch_sim  # noqa: E402


class WithHistory(pytorch_sim.CachingAllocatorSim):
    def __init__(self, *args, **kwargs):
        kwargs["record_history"] = True
        kwargs["max_trace_entries"] = None
        super().__init__(*args, **kwargs)


pytorch_sim.CachingAllocatorSim = WithHistory
out_path = os.path.join(sys.argv[3], "oracle-history-snapshot.json")
with open(sys.argv[2], encoding="utf-8") as jobs:
    for line in jobs:
        job = json.loads(line)
        try:
            pytorch_sim.replay(job["path"], conf=job.get("conf") or "",
                               capacity=job.get("capacity"),
                               memory_fraction=job.get("memory_fraction"),
                               snapshot_path=out_path)
            with open(out_path, encoding="utf-8") as f:
                print(json.dumps({"ok": json.load(f)}))
        except Exception as e:  # report, never crash the batch
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}))

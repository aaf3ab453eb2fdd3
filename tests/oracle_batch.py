#!/usr/bin/env python3
"""Run the reference model (oracle/pytorch_sim.py of the test data) on many traces in one
process: the same `replay` function its command line calls, without paying
Python's start-up per trace.

usage: oracle_batch.py ORACLE_DIR JOBS.jsonl
Each job line: {"path": ..., "conf": ..., "capacity": int|null, "memory_fraction": float|null}
Each output line: {"ok": memory_stats} or {"error": "..."}
"""
import json
import sys

sys.path.insert(0, sys.argv[1])
import pytorch_sim  # noqa: E402

with open(sys.argv[2], encoding="utf-8") as jobs:
    for line in jobs:
        job = json.loads(line)
        try:
            out = pytorch_sim.replay(job["path"], conf=job.get("conf") or "",
                                     capacity=job.get("capacity"),
                                     memory_fraction=job.get("memory_fraction"))
            print(json.dumps({"ok": out["devices"]["0"]["memory_stats"]}))
        except Exception as e:  # report, never crash the batch
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}))

#!/usr/bin/env python3
"""Check that memory snapshots are what PyTorch's readers expect.

usage: snapshot_check.py SNAPSHOT.pickle [SNAPSHOT.json] ...
For each pickle (and, when given, the JSON written beside it):
- it loads with an unpickler that refuses every global, its protocol is at
  most 4, every opcode is one that memory_viz's own JavaScript unpickler
  knows, and no integer is longer than its older version reads (8 bytes);
- the dict has the keys and types of torch.cuda.memory._snapshot() (segments,
  device_traces with one list per device index, allocator_settings);
- the blocks of each segment tile it in address order, and the segment's
  allocated / active / requested sizes are the sums of its blocks';
- `oom` entries carry device_free and no addr, every other entry an addr;
- the history replayed backwards from the final segments stays consistent,
  as memory_viz's "Allocator State History" needs: every alloc and
  free_requested finds its block, every block lies inside a segment, a
  segment_alloc leaves no block behind;
- the JSON file holds the same dict (tuples as lists).
Prints one line per file; exits 1 at the first problem, naming it.
"""
import bisect
import json
import pickle
import pickletools
import sys

# The opcodes memory_viz's unpickler (MemoryViz.js) handles.
VIZ_OPCODES = {
    "PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "EMPTY_TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET", "LONG_BINGET",
    "BINPUT", "LONG_BINPUT", "MEMOIZE", "BININT", "BININT1", "BININT2", "LONG1",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "MARK", "FRAME",
    "SHORT_BINUNICODE", "BINUNICODE", "BINFLOAT", "STOP", "EMPTY_LIST",
}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc",
           "segment_free", "segment_map", "segment_unmap", "snapshot", "oom"}


class NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global refused: {module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent id refused")


class Bad(Exception):
    pass


def need(cond, what):
    if not cond:
        raise Bad(what)


def check_opcodes(data):
    for op, arg, pos in pickletools.genops(data):
        if op.name == "PROTO":
            need(2 <= arg <= 4, f"pickle protocol {arg}: memory_viz reads 2 to 4")
        need(op.name in VIZ_OPCODES, f"opcode {op.name} is unknown to memory_viz's unpickler")
        if op.name == "LONG1":
            # The older MemoryViz.js refuses integers longer than 8 bytes.
            need(data[pos + 1] <= 8, f"a {data[pos + 1]}-byte integer at byte {pos}: memory_viz reads at most 8")


def check_frames(frames, where):
    need(isinstance(frames, list), f"{where}: frames is not a list")
    for f in frames:
        need(isinstance(f.get("name"), str) and isinstance(f.get("filename"), str)
             and isinstance(f.get("line"), int), f"{where}: a frame lacks name/filename/line")


def check_segments(snap):
    segs = snap["segments"]
    need(isinstance(segs, list), "segments is not a list")
    for k, s in enumerate(segs):
        w = f"segment {k}"
        for key, t in [("device", int), ("address", int), ("total_size", int),
                       ("allocated_size", int), ("active_size", int),
                       ("requested_size", int), ("stream", int), ("segment_type", str),
                       ("is_expandable", bool), ("blocks", list)]:
            need(isinstance(s.get(key), t), f"{w}: {key} missing or not {t.__name__}")
        need(s["segment_type"] in ("small", "large"), f"{w}: segment_type {s['segment_type']}")
        pid = s.get("segment_pool_id")
        need(isinstance(pid, (tuple, list)) and len(pid) == 2, f"{w}: segment_pool_id")
        check_frames(s.get("frames", []), w)
        addr, alloc, active, req = s["address"], 0, 0, 0
        for j, b in enumerate(s["blocks"]):
            bw = f"{w} block {j}"
            need(b.get("state") in STATES, f"{bw}: state {b.get('state')}")
            need(isinstance(b.get("size"), int) and b["size"] > 0, f"{bw}: size")
            need(isinstance(b.get("requested_size"), int), f"{bw}: requested_size")
            if "address" in b:
                need(b["address"] == addr, f"{bw}: at {b['address']:#x}, expected {addr:#x} (blocks must tile)")
            check_frames(b.get("frames", []), bw)
            addr += b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                req += b["requested_size"]
        need(addr - s["address"] == s["total_size"], f"{w}: blocks sum to {addr - s['address']}, total_size {s['total_size']}")
        need(alloc == s["allocated_size"], f"{w}: allocated_size {s['allocated_size']} != {alloc}")
        need(active == s["active_size"], f"{w}: active_size {s['active_size']} != {active}")
        need(req == s["requested_size"], f"{w}: requested_size {s['requested_size']} != {req}")


def check_traces(snap):
    traces = snap["device_traces"]
    need(isinstance(traces, list) and all(isinstance(t, list) for t in traces),
         "device_traces is not a list of lists")
    for s in snap["segments"]:
        need(s["device"] < len(traces), f"device {s['device']} has no trace list")
    for d, trace in enumerate(traces):
        for i, e in enumerate(trace):
            w = f"device {d} entry {i}"
            need(e.get("action") in ACTIONS, f"{w}: action {e.get('action')}")
            need(isinstance(e.get("size"), int) and isinstance(e.get("stream"), int), f"{w}: size/stream")
            if e["action"] == "oom":
                need("device_free" in e and "addr" not in e, f"{w}: oom needs device_free and no addr")
            else:
                need(isinstance(e.get("addr"), int) and "device_free" not in e, f"{w}: addr")
            check_frames(e.get("frames", []), w)


def merge_ranges(segs):
    out = {}
    for base in sorted(segs):
        last = max(out, default=None)
        if last is not None and last + out[last] == base:
            out[last] += segs[base]
        else:
            out[base] = segs[base]
    return out


def cut_range(segs, start, end):
    out = {}
    for base, n in segs.items():
        if base + n <= start or base >= end:
            out[base] = n
            continue
        if base < start:
            out[base] = start - base
        if base + n > end:
            out[end] = base + n - end
    return out


def replay_backwards(snap):
    """memory_viz's Allocator State History, from the final state back."""
    for s in snap["segments"]:
        a = s["address"]
        for b in s["blocks"]:
            need(s["address"] <= a < s["address"] + s["total_size"], f"block at {a:#x} outside its segment")
            a += b["size"]
    for d, trace in enumerate(snap["device_traces"]):
        segs = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == d}
        blocks = {}
        for s in snap["segments"]:
            if s["device"] != d:
                continue
            a = s["address"]
            for b in s["blocks"]:
                if b["state"] != "inactive":
                    blocks[a] = {"size": b["size"], "free_requested": b["state"] == "active_pending_free"}
                a += b["size"]

        def inside(addr, size):
            bases = sorted(segs)
            k = bisect.bisect_right(bases, addr) - 1
            return k >= 0 and addr + size <= bases[k] + segs[bases[k]]

        for i in range(len(trace) - 1, -1, -1):
            e = trace[i]
            w = f"device {d} entry {i} ({e['action']} at {e.get('addr', 0):#x}), walking back"
            act, addr = e["action"], e.get("addr")
            if act == "alloc":
                need(addr in blocks, f"{w}: no block to take back")
                del blocks[addr]
            elif act == "free_requested":
                need(addr in blocks, f"{w}: no block (memory_viz throws here)")
                blocks[addr]["free_requested"] = False
            elif act == "free_completed":
                need(addr not in blocks, f"{w}: the block is still there")
                # Every block stays inside a segment: checked where a block
                # comes back here, and where a segment goes (segment_alloc).
                need(inside(addr, 1), f"{w}: not inside any segment")
                blocks[addr] = {"size": 1, "free_requested": True}
            elif act == "segment_free":
                segs[addr] = e["size"]
            elif act == "segment_alloc":
                need(segs.get(addr) == e["size"], f"{w}: no such segment")
                need(not any(addr <= b < addr + e["size"] for b in blocks), f"{w}: blocks left inside")
                del segs[addr]
            elif act == "segment_unmap":
                # Expandable segments: mapped ranges, merged when adjacent.
                segs[addr] = e["size"]
                segs = merge_ranges(segs)
            elif act == "segment_map":
                end = addr + e["size"]
                need(inside(addr, e["size"]), f"{w}: the range is not mapped after it")
                need(not any(addr <= b < end for b in blocks), f"{w}: blocks left inside")
                segs = cut_range(segs, addr, end)


def check(path, json_path=None):
    data = open(path, "rb").read()
    check_opcodes(data)
    snap = NoGlobals(open(path, "rb")).load()
    need(isinstance(snap, dict), "not a dict")
    if "allocator_settings" in snap or "--settings" in sys.argv:
        need(isinstance(snap.get("allocator_settings"), dict), "allocator_settings missing")
    check_segments(snap)
    check_traces(snap)
    replay_backwards(snap)
    if json_path:
        as_json = json.loads(json.dumps(snap))
        need(json.load(open(json_path)) == as_json, f"{json_path} differs from {path}")
    entries = sum(len(t) for t in snap["device_traces"])
    return f"{path}: ok ({len(snap['segments'])} segments, {entries} trace entries)"


def main():
    args = [a for a in sys.argv[1:] if a != "--settings"]
    pairs = []
    for a in args:
        if a.endswith(".json") and pairs:
            pairs[-1] = (pairs[-1][0], a)
        else:
            pairs.append((a, None))
    for p, j in pairs:
        try:
            print(check(p, j))
        except Bad as e:
            print(f"{p}: {e}")
            sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""BENCHMARKS.md's tables from the raw outputs scripts/bench.sh leaves.

usage: scripts/bench_report.py OUT CRITERION_DIR

Prints markdown: the commit, date and machine, then one table per measure.
A measure whose output is missing is said to be missing, not left out.
"""
import json
import os
import re
import statistics
import sys

GIB = 2**30
MIB = 2**20


def criterion(root):
    """full_id -> median in ns, from criterion's estimates."""
    out = {}
    for dirpath, _, files in os.walk(root):
        if os.path.basename(dirpath) != "new" or "benchmark.json" not in files:
            continue
        try:
            bench = json.load(open(os.path.join(dirpath, "benchmark.json")))
            est = json.load(open(os.path.join(dirpath, "estimates.json")))
        except (OSError, ValueError):
            continue
        out[bench["full_id"]] = est["median"]["point_estimate"]
    return out


def ns(v):
    return "-" if v is None else ("%.1f ns" % v if v < 1000 else "%.2f µs" % (v / 1000))


def ms(v):
    return "-" if v is None else "%.2f ms" % (v / 1e6)


def size(b):
    return "%.2f GiB" % (b / GIB) if b >= GIB else "%.2f MiB" % (b / MIB)


def table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 1))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()


def lines(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        return None


def text(path):
    try:
        return open(path).read()
    except OSError:
        return None


def missing(what):
    print("(%s: no output; see the log of scripts/bench.sh)\n" % what)


def main():
    out, crit_dir = sys.argv[1], sys.argv[2]
    meta = json.load(open(os.path.join(out, "meta.json")))
    c = criterion(crit_dir)
    q = " **Quick mode: these figures check the script, not the machine.**" if meta.get("quick") else ""
    print("Measured by `scripts/bench.sh` at commit %s on %s: %s, %s cores, %s GiB, %s, %s.%s\n" % (
        meta["commit"], meta["date"], meta["cpu"], meta["cores"], meta["memory_gib"], meta["os"],
        meta["rustc"], q))

    print("### Cache-hit pair on the simulated device (criterion median, ns per malloc + free)\n")
    rows = []
    for name, label in [("small_4KiB", "small pool, 4 KiB"), ("large_8MiB", "large pool, 8 MiB")]:
        rows.append([label] + [ns(c.get("cache_hit_pair/%s/%d_streams" % (name, s))) for s in (1, 4)])
    table(["pair", "1 stream", "4 streams (round robin)"], rows)

    print("### Instructions per pair (callgrind, `scripts/callgrind-pair.sh [CONF] [locked]`)\n")
    t = text(os.path.join(out, "callgrind.txt"))
    found = re.findall(r"^(?:pair_loop )?(.*): (\d+) instructions per pair", t or "", re.M)
    if found:
        table(["configuration", "instructions"], [[{"locked": "(default), through the lock (`CachingAllocator`)"}.get(k.strip(), k.strip()), v]
                                                 for k, v in found])
    else:
        print((t or "").strip() or "(no callgrind output)")
        print()

    print("### The 4 KiB pair with N free blocks in the index (criterion median)\n")
    sc = {int(k.rsplit("/", 1)[1]): v for k, v in c.items() if k.startswith("scaling/")}
    if sc:
        ns_ = sorted(sc)
        table(["free blocks"] + ["{:,}".format(n) for n in ns_],
              [["pair"] + [ns(sc[n]) for n in ns_],
               ["ratio to the first"] + ["%.2f" % (sc[n] / sc[ns_[0]]) for n in ns_]])
    else:
        missing("scaling")

    print("### The C library's pair against the core's (`capi/examples/pair_cost`, best round, ns)\n")
    t = text(os.path.join(out, "pair_cost.txt"))
    if t:
        rows = re.findall(r"^  (\S.*?)\s{2,}(\d+\.\d)(.*)$", t, re.M)
        table(["loop", "ns per pair", ""], [[a.strip(), b, d.strip()] for a, b, d in rows])
    else:
        missing("pair_cost")

    print("### Threads (ns per pair per thread)\n")
    th = {int(k.rsplit("/", 1)[1]): v for k, v in c.items() if k.startswith("threads/")}
    t = text(os.path.join(out, "threads_cost.txt")) or ""
    tc = {int(m[0]): m[1:] for m in re.findall(r"^\s+(\d+)\s+(\d+\.\d)\s+(\d+\.\d)\s+(\d+\.\d)$", t, re.M)}
    rows = []
    for n in sorted(set(th) | set(tc)):
        rows.append([n, ns(th.get(n))] + (list(tc[n]) if n in tc else ["-"] * 3))
    table(["threads", "core `CachingAllocator`, one device (criterion)", "C library: own device",
           "own device, free by pointer", "one device"], rows)

    print("### Releasing segments while another device runs pairs (`capi/examples/release_stall`, best of 3)\n")
    t = text(os.path.join(out, "release_stall.txt"))
    if t:
        n = re.search(r"segments released:\s+(\d+)", t)
        r = re.search(r"release \(empty_cache\):\s+(\S+ ms)", t)
        w = re.search(r"slowest pair on device 1:\s+(\S+ ms) \((\d+) pairs", t)
        table(["segments released by `empty_cache` on device 0", "release", "slowest pair on device 1 (free with device -1)", "pairs during it"],
              [["{:,}".format(int(n[1])) if n else "-", r[1] if r else "-", w[1] if w else "-", w[2] if w else "-"]])
    else:
        missing("release_stall")

    print("### Replay: parsing and bookkeeping per trace (criterion median)\n")
    rows = []
    ev = {}
    for r in lines(os.path.join(out, "end_to_end.jsonl")) or []:
        ev[os.path.basename(r["trace"]).split(".")[0]] = r["events"]
    for name in sorted({k.split("/")[1] for k in c if k.startswith("replay/")}):
        p, b = c.get("replay/%s/parse" % name), c.get("replay/%s/bookkeeping" % name)
        n = ev.get(name)
        rate = lambda v: "-" if not (v and n) else "%.2f M/s" % (n / v * 1e3)  # noqa: E731
        rows.append([name, "{:,}".format(n) if n else "-", ms(p), rate(p), ms(b), rate(b)])
    table(["trace", "events", "parse", "parse rate", "bookkeeping", "bookkeeping rate"], rows)

    print("### Peers: the same allocs and frees, bookkeeping only (criterion median)\n")
    rows = []
    for name in sorted({k.split("/")[1] for k in c if k.startswith("peers/")}):
        v = [c.get("peers/%s/%s" % (name, p)) for p in ("cachealloc", "offset-allocator", "rlsf", "btreemap-best-fit")]
        ratio = "%.1fx" % (v[0] / v[1]) if v[0] and v[1] else "-"
        rows.append([name] + [ms(x) for x in v] + [ratio])
    table(["trace", "cachealloc", "offset-allocator", "rlsf", "BTreeMap best fit", "cachealloc / offset-allocator"], rows)

    print("### Fragmentation per trace (printed by the replay bench)\n")
    t = text(os.path.join(out, "replay.txt")) or ""
    frag = [l.replace(".jsonl.gz", "") for l in t.splitlines() if l.startswith("|")]
    print("\n".join(frag) + "\n" if frag else "(missing)\n")

    print("### Policies: default, expandable segments, compact (`cachealloc compare --min-capacity`)\n")
    rs = lines(os.path.join(out, "compare.jsonl")) or []
    by = {}
    for r in rs:
        by.setdefault(os.path.basename(r["trace"]).split(".")[0], {})[r["conf"]] = r
    rows = []
    confs = ["", "expandable_segments:True", "policy:compact"]
    for name, d in sorted(by.items()):
        live = lambda r: max(r.get("device_peak_live_bytes") or [r["peak_live_bytes"]])  # noqa: E731
        row = [name]
        row += ["%.3f" % (d[k]["peak_reserved_bytes"] / live(d[k])) if k in d else "-" for k in confs]
        row += ["%.4f" % (d[k]["min_capacity"] / live(d[k])) if k in d and d[k].get("min_capacity") else "-" for k in confs]
        row += ["{:,}".format(d[k]["num_device_alloc"] + d[k]["num_device_free"]) if k in d else "-" for k in confs]
        rows.append(row)
    table(["trace", "peak reserved / live: default", "expandable", "compact", "min capacity / live: default",
           "expandable", "compact", "device calls: default", "expandable", "compact"], rows)

    print("### A fresh stream per step (`cachealloc generate fresh-streams`, then `compare`)\n")
    free = {r["conf"]: r for r in lines(os.path.join(out, "fresh.jsonl")) or []}
    cap = {r["conf"]: r for r in lines(os.path.join(out, "fresh-4gib.jsonl")) or []}
    rows = []
    for k in confs:
        if k not in free:
            continue
        a, b = free[k], cap.get(k, {})
        calls = lambda r: "{:,}".format(r["num_device_alloc"] + r["num_device_free"]) if r else "-"  # noqa: E731
        rows.append([k or "default", size(a["peak_live_bytes"]),
                     "%s (%.1fx)" % (size(a["peak_reserved_bytes"]), a["peak_reserved_bytes"] / a["peak_live_bytes"]),
                     calls(a), size(b["peak_reserved_bytes"]) if b else "-", calls(b), b.get("ooms", "-")])
    table(["configuration", "peak live", "peak reserved", "device calls", "peak reserved (4 GiB)",
           "device calls (4 GiB)", "OOMs (4 GiB)"], rows)

    print("### End to end: `cachealloc replay --json` (median of the runs)\n")
    by = {}
    for r in lines(os.path.join(out, "end_to_end.jsonl")) or []:
        by.setdefault(os.path.basename(r["trace"]).split(".")[0], []).append(r)
    rows = []
    for name, rs in sorted(by.items()):
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        rows.append([name, "{:,}".format(rs[0]["events"]), "%.1f ms" % (med("total_seconds") * 1e3),
                     "%.2f M/s" % (med("end_to_end_events_per_second") / 1e6),
                     "%.2f M/s" % (med("events_per_second") / 1e6)])
    table(["trace", "events", "total", "end to end", "bookkeeping alone"], rows)

    print("### Scale: N live blocks of 512 B to 64 KiB, then freed (`generate scale`, `replay --json`; median)\n")
    by = {}
    for r in lines(os.path.join(out, "scale.jsonl")) or []:
        by.setdefault((r["blocks"], r["order"]), []).append(r)
    rows = []
    for n in sorted({k[0] for k in by}):
        row = ["{:,}".format(n)]
        for order in ("random", "forward", "reverse"):
            rs = by.get((n, order), [])
            row.append("%.2f M/s" % (statistics.median(r["events_per_second"] for r in rs) / 1e6) if rs else "-")
        row.append("{:,}".format(by[(n, "random")][0]["slots_used"]) if (n, "random") in by else "-")
        rows.append(row)
    table(["live blocks", "random order", "allocation order", "reverse", "slots used"], rows)

    print("### The C++ allocator for torch: a 4 KiB pair through `CUDAAllocator` (`python/tests/native_bench.cpp`)\n")
    t = text(os.path.join(out, "native_bench.txt"))
    if t:
        got = re.findall(r"C\+\+ allocator object ([\d.]+) ns, C functions ([\d.]+) ns", t)
        torch_v = (text(os.path.join(out, "native_torch.txt")) or "").strip().splitlines()[-1:]
        table(["round (torch %s)" % (torch_v[0] if torch_v else "?"), "through the C++ allocator (`alloc` + `raw_delete`)",
               "the C functions it calls"], [[i + 1, a + " ns", b + " ns"] for i, (a, b) in enumerate(got)])
    else:
        print("(not run: set CACHEALLOC_TORCH_PYTHON to a Python with a CUDA build of torch)\n")

    print("### Heap allocations per operation (`tests/tests/no_heap.rs`, asserted)\n")
    t = text(os.path.join(out, "no_heap.txt")) or ""
    got = re.findall(r"heap allocations [^\n]*?: \d+", t)
    print("\n".join("- " + g for g in got) + "\n" if got else "(missing)\n")


if __name__ == "__main__":
    main()

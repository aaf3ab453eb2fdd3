#!/usr/bin/env python3
"""The project's surfaces and their sizes, as docs/design.md's table
("The surfaces") gives them: each operation, setting or error is written
once per surface it appears on, so these counts are what one more costs.

    python3 scripts/surfaces.py        # a Markdown table, from the sources
"""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def block_after(text, start):
    """The text of the brace block that opens after `start`."""
    i = text.index("{", text.index(start))
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j + 1]
    raise ValueError("unbalanced braces after %r" % start)


def uncommented(c_text):
    c_text = re.sub(r"/\*.*?\*/", "", c_text, flags=re.S)
    return re.sub(r"//[^\n]*", "", c_text)


def main():
    allocator = os.path.join(ROOT, "core", "src", "allocator")
    device_fns = sum(len(re.findall(r"^    pub fn ", read("core", "src", "allocator", f), re.M))
                     for f in sorted(os.listdir(allocator)) if f.endswith(".rs"))
    shared = read("core", "src", "shared.rs")
    trait = block_after(shared, "pub trait SharedAllocator")
    hand_fns = len(re.findall(r"^    fn ", trait, re.M))
    table = read("core", "src", "operations.rs")
    table_fns = len(re.findall(r"^        (?:with|try_with|try_growing) fn \w+", table, re.M))
    made_c = len(re.findall(r"^        c (?:status|void|value\([^)]*\)) cachealloc_\w+", table, re.M))
    header = uncommented(read("capi", "include", "cachealloc.h"))
    c_fns = len(set(re.findall(r"\b(cachealloc_\w+)\(", header)))
    prototypes = read("python", "cachealloc", "_prototypes.py")
    py_fns = len(re.findall(r'^    "cachealloc_\w+": \(', prototypes, re.M))
    cpp = uncommented(read("python", "cachealloc", "native", "allocator.cpp"))
    overrides = len(re.findall(r"\boverride\b", cpp))
    keys = read("core", "src", "config", "keys.rs")
    key_names = re.findall(r"names: &\[([^\]]*)\]", keys)
    spellings = sum(len(re.findall(r'"\w+"', n)) for n in key_names)
    rows = [
        ("`DeviceAllocator` public functions", "`core/src/allocator/*.rs`", device_fns),
        ("`SharedAllocator` methods: from the operation table, by hand",
         "`core/src/operations.rs`, `core/src/shared.rs`", "%d + %d" % (table_fns, hand_fns)),
        ("C functions (the header's): all", "`capi/include/cachealloc.h`", c_fns),
        ("C functions made from the operation table", "`core/src/operations.rs` (`c` clauses)", made_c),
        ("Python prototypes (generated from the header)", "`python/cachealloc/_prototypes.py`", py_fns),
        ("C++ `CUDAAllocator` overrides", "`python/cachealloc/native/allocator.cpp`", overrides),
        ("settings keys (their spellings)", "`core/src/config/keys.rs` (`KEYS`)",
         "%d (%d)" % (len(key_names), spellings)),
    ]
    print("| surface | where | count |")
    print("| --- | --- | ---: |")
    for name, where, n in rows:
        print("| %s | %s | %s |" % (name, where, n))


if __name__ == "__main__":
    main()

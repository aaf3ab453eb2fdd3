// Drives cachealloc's C++ allocator for torch (cachealloc/native/allocator.cpp,
// compiled in here) directly, on the simulated device (CACHEALLOC_BACKEND=mock,
// CACHEALLOC_MOCK_CAPACITY=1GiB): no GPU, no Python. Built and run by
// test_native.py, which also reads what it prints: the statistics as
// torch's memory_stats() keys, cachealloc's own, and the SnapshotInfo's
// segments and blocks (compared there with cachealloc's snapshot file).
//
// Usage: native_driver SNAPSHOT.json   (where cachealloc's snapshot goes)

#include <new>
#include <string>

// The callbacks' test seam (c_calls.h): the callback named `fault_at`
// throws std::bad_alloc the (`fault_after` + 1)-th time it runs, as a
// push_back or a string in it would when memory runs out.
static const char* fault_at = nullptr;
static int fault_after = 0;
static void callback_fault(const char* where) {
    if (fault_at != nullptr && std::string(where) == fault_at && fault_after-- == 0) {
        fault_at = nullptr;
        throw std::bad_alloc();
    }
}
#define CACHEALLOC_CALLBACK_FAULT(where) callback_fault(where)

#include "../cachealloc/native/allocator.cpp"

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <stdexcept>
#include <thread>

namespace {

namespace CA = c10::cuda::CUDACachingAllocator;
namespace CDA = c10::CachingDeviceAllocator;

int failures = 0;

// torch's pluggable allocator as a MemPool's allocator (what
// torch.cuda.MemPool(allocator=CUDAPluggableAllocator(...)) hands to
// createOrIncrefPool). torch's raw_alloc asks the CUDA runtime for the
// current device and stream, which this machine lacks: device 0, the
// default stream; the rest (its alloc_fn / free_fn, its size table) is
// torch's own.
struct PoolAllocator : torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
    using CUDAPluggableAllocator::CUDAPluggableAllocator;
    void* raw_alloc(size_t n) override { return malloc(n, 0, nullptr); }
};

// The calls of the pool allocator's alloc_fn / free_fn: addresses handed
// out downwards from 0x7e0000000000 (the newest segment lowest).
struct PoolCalls {
    int allocs = 0, frees = 0;
    size_t live = 0;
    uintptr_t next = uintptr_t(0x7e0000000000);
    std::function<void()> inside;  // run in alloc_fn (a call back into cachealloc)
};

#define EXPECT(cond, ...)                                               \
    do {                                                                \
        if (!(cond)) {                                                  \
            std::fprintf(stderr, "FAIL line %d: %s: ", __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                          \
            std::fprintf(stderr, "\n");                                 \
            failures++;                                                 \
        }                                                               \
    } while (0)

// torch's memory_stats() keys of `s` (torch/csrc/cuda/Module.cpp flattens
// DeviceStats this way).
std::map<std::string, int64_t> torch_keys(const CDA::DeviceStats& s) {
    std::map<std::string, int64_t> out;
    auto stat = [&](const std::string& name, const CDA::Stat& v) {
        out[name + ".current"] = v.current;
        out[name + ".peak"] = v.peak;
        out[name + ".allocated"] = v.allocated;
        out[name + ".freed"] = v.freed;
    };
    auto array = [&](const std::string& name, const CDA::StatArray& a) {
        const char* pools[] = {"all", "small_pool", "large_pool"};
        for (size_t i = 0; i < 3; i++) stat(name + "." + pools[i], a[i]);
    };
    array("allocation", s.allocation);
    array("segment", s.segment);
    array("active", s.active);
    array("inactive_split", s.inactive_split);
    array("allocated_bytes", s.allocated_bytes);
    array("reserved_bytes", s.reserved_bytes);
    array("active_bytes", s.active_bytes);
    array("inactive_split_bytes", s.inactive_split_bytes);
    array("requested_bytes", s.requested_bytes);
    out["num_alloc_retries"] = s.num_alloc_retries;
    out["num_ooms"] = s.num_ooms;
    stat("oversize_allocations", s.oversize_allocations);
    stat("oversize_segments", s.oversize_segments);
    out["num_sync_all_streams"] = s.num_sync_all_streams;
    out["num_device_alloc"] = s.num_device_alloc;
    out["num_device_free"] = s.num_device_free;
    out["max_split_size"] = s.max_split_size;
#if CACHEALLOC_TORCH_OOM_REJECTION_STAT
    out["num_oom_rejections"] = s.num_oom_rejections;
#endif
#if CACHEALLOC_TORCH_POOL_RESERVED_STATS
    for (const auto& [id, a] : s.reserved_bytes_by_private_pools) {
        array("reserved_bytes_by_private_pools." + std::to_string(id.first) + "_" +
                  std::to_string(id.second),
              a);
    }
#endif
    return out;
}

// A callback of the C library: noexcept (the header's callback types are),
// its allocation failure ends the test.
void collect(const char* key, int64_t value, void* user) noexcept {
    (*static_cast<std::map<std::string, int64_t>*>(user))[key] = value;
}

std::map<std::string, int64_t> cachealloc_keys(int device) {
    std::map<std::string, int64_t> out;
    cachealloc_memory_stats(device, collect, &out);
    return out;
}

void stats_equal(CA::CUDAAllocator& a, const char* when) {
    auto ours = cachealloc_keys(0);
    auto torch = torch_keys(a.getDeviceStats(0));
    EXPECT(ours.size() == torch.size(), "%s: %zu keys vs %zu", when, ours.size(), torch.size());
    size_t differ = 0;
    for (const auto& [k, v] : ours) {
        auto it = torch.find(k);
        if (it == torch.end() || it->second != v) {
            differ++;
            std::fprintf(stderr, "  %s: %s cachealloc %lld torch %lld\n", when, k.c_str(),
                         (long long)v, it == torch.end() ? -1LL : (long long)it->second);
        }
    }
    EXPECT(differ == 0, "%s: %zu keys differ", when, differ);
    std::printf("ok getDeviceStats equals cachealloc's statistics key for key (%zu keys, %s)\n",
                torch.size(), when);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: native_driver SNAPSHOT.json\n");
        return 2;
    }
    auto& self = *cachealloc_torch::instance();
    CA::CUDAAllocator& a = self;
    a.init(1);
    EXPECT(a.initialized() && a.name() == "cachealloc", "init and name");

    // ------------------------------------------------ allocations, stats
    int ooms = 0;
    size_t oom_size = 0;
    a.attachOutOfMemoryObserver([&](int64_t device, size_t size, size_t, size_t) {
        ooms++;
        oom_size = size;
        EXPECT(device == 0, "observer's device");
    });
    int traced = 0;
    a.attachAllocatorTraceTracker([&](const CDA::TraceEntry& e) {
        if (e.action_ == CDA::TraceEntry::ALLOC) traced++;
    });
    auto stream = reinterpret_cast<cudaStream_t>(0);
    std::vector<void*> ptrs;
    for (size_t i = 1; i <= 8; i++) ptrs.push_back(self.alloc(i * (300 << 10), 0, stream));
    ptrs.push_back(self.alloc(30 << 20, 0, stream));
    a.raw_delete(ptrs[2]);
    a.raw_delete(ptrs[5]);
    stats_equal(a, "after allocations and frees");
    EXPECT(traced == 9, "the trace tracker saw %d allocations", traced);

    // --------------------------------------------------------------- OOM
    bool threw = false;
    try {
        self.alloc(size_t(2) << 30, 0, stream);
    } catch (const c10::OutOfMemoryError& e) {
        threw = true;
        std::string what = e.what();
        EXPECT(what.find("CUDA out of memory. Tried to allocate 2.00 GiB") != std::string::npos,
               "message: %s", what.c_str());
    }
    EXPECT(threw, "an impossible allocation throws c10::OutOfMemoryError");
    EXPECT(ooms == 1, "torch's OOM observer ran %d times", ooms);
    std::printf("ok an impossible allocation throws c10::OutOfMemoryError with cachealloc's "
                "message, and torch's OOM observer runs (alloc_size %zu)\n", oom_size);
    stats_equal(a, "after an out-of-memory");
    bool other = false;
    try {
        a.raw_delete(reinterpret_cast<void*>(0x1234));
    } catch (const c10::OutOfMemoryError&) {
    } catch (const c10::Error& e) {
        other = std::string(e.what()).find("not allocated by cachealloc") != std::string::npos;
    }
    EXPECT(other, "a bad free throws c10::Error, not an out-of-memory");

    // ---------------------------------------------------------- cacheInfo
    size_t largest = 0;
    a.cacheInfo(0, &largest);
    auto info = a.getMemoryInfo(0);
    EXPECT(info.second == (size_t(1) << 30), "total %zu", info.second);
    EXPECT(largest == info.first, "a zero guess is the free memory: %zu vs %zu", largest,
           info.first);
    size_t cached = 1;
    a.cacheInfo(0, &cached);
    size_t want = 0;
    cachealloc_cache_info(0, nullptr, &want);
    EXPECT(cached == want && want > 0, "largest cached block %zu vs %zu", cached, want);
    std::printf("ok cacheInfo answers (free %zu, largest cached block %zu)\n", largest, cached);

    // ------------------------------------------------------- pool hooks
    int filter_calls = 0;
    auto side = reinterpret_cast<cudaStream_t>(7);
    c10::MempoolId_t pool{7, 1};
    a.beginAllocateToPool(0, pool, [&](cudaStream_t s) {
        filter_calls++;
        return s == side;
    });
    void* in_pool = self.alloc(5 << 20, 0, side);
    void* outside = self.alloc(5 << 20, 0, reinterpret_cast<cudaStream_t>(3));
    a.endAllocateToPool(0, pool);
    EXPECT(filter_calls >= 2, "the filter was called %d times", filter_calls);
    auto pool_snap = a.snapshot(pool, false);
    EXPECT(pool_snap.segments.size() == 1 && pool_snap.segments[0].owner_private_pool_id == pool,
           "one segment of the pool (%zu)", pool_snap.segments.size());
    EXPECT(a.checkPoolLiveAllocations(0, pool, {in_pool}), "the pool's live allocation");
    EXPECT(!a.checkPoolLiveAllocations(0, pool, {outside}), "not the other one");
    a.raw_delete(in_pool);
    a.raw_delete(outside);
    a.releasePool(0, pool);
    auto segments = a.getDeviceStats(0).segment[0].current;
    a.emptyCache(pool);
    EXPECT(a.getDeviceStats(0).segment[0].current == segments - 1, "emptyCache(pool) freed it");
    std::printf("ok the pool hooks call the filter (%d calls) and route only its stream\n",
                filter_calls);

    // ------------------------ cudagraph trees: checkpoint and restore a pool
    c10::MempoolId_t graph{5, 0};
    a.beginAllocateToPool(0, graph, [](cudaStream_t) { return true; });
    void* g1 = self.alloc(1 << 20, 0, stream);
    void* g2 = self.alloc(2 << 20, 0, stream);
    void* g3 = self.alloc(1 << 20, 0, stream);
    a.endAllocateToPool(0, graph);
    a.raw_delete(g2);
    auto checkpoint = a.getCheckpointState(0, graph);
    a.raw_delete(g1);  // the pool moves on
    a.beginAllocateToPool(0, graph, [](cudaStream_t) { return true; });
    void* g4 = self.alloc(3 << 20, 0, stream);
    a.endAllocateToPool(0, graph);
    auto delta = a.setCheckpointPoolState(0, checkpoint);
    std::unordered_set<void*> freed(delta.ptrs_freed.begin(), delta.ptrs_freed.end());
    std::unordered_set<void*> made;
    for (auto& d : delta.dataptrs_allocd) made.insert(d.get());
    EXPECT(freed == (std::unordered_set<void*>{g3, g4}), "the live allocations were freed (%zu)",
           freed.size());
    EXPECT(made == (std::unordered_set<void*>{g1, g3}), "the checkpoint's came back (%zu)",
           made.size());
    EXPECT(a.checkPoolLiveAllocations(0, graph, made), "and are the pool's live ones");
    stats_equal(a, "after a checkpoint restore");
    delta.dataptrs_allocd.clear();  // torch frees them through their deleter
    EXPECT(!a.checkPoolLiveAllocations(0, graph, made), "freed");
    a.releasePool(0, graph);  // one user per beginAllocateToPool
    a.releasePool(0, graph);
    a.emptyCache(graph);
    EXPECT(a.getPoolUseCount(0, graph) == 0, "the graph's pool is gone");
    std::printf("ok getCheckpointState / setCheckpointPoolState rewind a graph's pool "
                "(%zu freed, %zu handed back)\n", freed.size(), made.size());

#if CACHEALLOC_TORCH_MARK_CAPTURE
    // ------- torch 2.13's capture marks: a capture apart from the routing
    // (CUDAGraph::capture_begin: beginAllocateToPool, then markCaptureBegin).
    // While marked, emptyCache gives nothing back; an unmatched end throws.
    c10::MempoolId_t marked{6, 0};
    void* kept = self.alloc(3 << 20, 0, stream);
    a.raw_delete(kept);  // a cached segment of the default pool
    int64_t reserved_before = a.getDeviceStats(0).reserved_bytes[0].current;
    a.beginAllocateToPool(0, marked, [](cudaStream_t) { return true; });
    a.markCaptureBegin(0);
    a.emptyCache({0, 0});
    EXPECT(a.getDeviceStats(0).reserved_bytes[0].current == reserved_before,
           "no segment is freed during a marked capture");
    a.markCaptureEnd(0);
    a.endAllocateToPool(0, marked);
    bool unmatched = false;
    try {
        a.markCaptureEnd(0);
    } catch (const c10::Error&) {
        unmatched = true;
    }
    EXPECT(unmatched, "markCaptureEnd without a mark throws");
    a.releasePool(0, marked);
    a.emptyCache({0, 0});
    EXPECT(a.getDeviceStats(0).reserved_bytes[0].current < reserved_before,
           "after the capture emptyCache frees");
    std::printf("ok markCaptureBegin / markCaptureEnd mark a capture apart from the routing\n");
#endif

    // ---------------- torch.cuda.MemPool: create, use_mem_pool, release
    c10::MempoolId_t mem{0, 9};
    a.createOrIncrefPool(0, mem, nullptr);
    a.setUseOnOOM(0, mem, true);
    EXPECT(a.getPoolUseCount(0, mem) == 1, "MemPool(): one user");
    auto this_thread = std::this_thread::get_id();
    a.beginAllocateToPool(0, mem, [this_thread](cudaStream_t) {
        return std::this_thread::get_id() == this_thread;  // use_mem_pool's filter
    });
    EXPECT(a.getPoolUseCount(0, mem) == 2, "use_mem_pool adds a user");
    void* pooled = self.alloc(3 << 20, 0, stream);
    a.endAllocateToPool(0, mem);
    a.releasePool(0, mem);
    EXPECT(a.getPoolUseCount(0, mem) == 1, "and takes it away");
    EXPECT(a.checkPoolLiveAllocations(0, mem, {pooled}), "the allocation is the pool's");
    a.raw_delete(pooled);
    a.releasePool(0, mem);  // ~MemPool
    a.emptyCache(mem);
    EXPECT(a.getPoolUseCount(0, mem) == 0, "gone");
    std::printf("ok torch.cuda.MemPool's calls: createOrIncrefPool, use counts, use_mem_pool's "
                "thread filter, releasePool and emptyCache of the pool\n");

    // ------------- torch's IPC handle strings: 'c', and 'e' (expandable)
    {
        using cachealloc_torch::handle_string;
        using cachealloc_torch::pages_string;
        using cachealloc_torch::parse_handle_string;
        using cachealloc_torch::parse_pages_string;
        cachealloc_ipc_pages p{};
        p.pid = 4242;
        p.pages = 3;
        p.page_size = 20 << 20;
        int fds[3] = {17, 18, 19};
        bool ok = true;
        for (char version : {char(2), char(3)}) {
            std::string s = pages_string(p, fds, version);
            ok &= s.size() == size_t(2 + (version == 3 ? 32 : 24) + 12) && s[1] == 'e';
            std::vector<int> back;
            cachealloc_ipc_pages q = parse_pages_string(s, back);
            ok &= q.pid == 4242 && q.pages == 3 && q.page_size == (20u << 20) && back.size() == 3 &&
                  back[0] == 17 && back[2] == 19;
        }
        EXPECT(ok, "'e' strings of both layouts round-trip");
        std::string fabric = pages_string(p, fds, 3);
        fabric[2 + 24] = 2;  // handle type: fabric
        std::vector<int> none;
        bool refused = false;
        try {
            parse_pages_string(fabric, none);
        } catch (const c10::Error& e) {
            refused = std::string(e.what()).find("fabric") != std::string::npos;
        }
        EXPECT(refused, "fabric handles are refused by name");
        cachealloc_ipc_handle c{};
        c.handle[0] = 7;
        std::string v3 = handle_string(c);
        v3[0] = 3;  // torch 2.13 on writes version 3
        EXPECT(parse_handle_string(v3).handle[0] == 7, "a version 3 'c' handle opens");
        std::printf("ok torch's IPC handle strings: 'e' of torch 2.11-2.12 and 2.13 on, fabric refused, "
                    "a 2.13 'c' handle read\n");
    }

    // ----------- allocateWithAddress (torch 2.13's _resize_with_addr_)
    {
        auto* x = static_cast<char*>(self.alloc(4 << 20, 0, stream));
        a.raw_delete(x);
        void* y = self.alloc_at(3 << 20, 0, stream, x + (6 << 20));
        EXPECT(y == x + (6 << 20), "at the address asked for");
        auto msg = [&](void* at) {
            try {
                self.alloc_at(1 << 20, 0, stream, at);
            } catch (const c10::Error& e) {
                return std::string(e.what());
            }
            return std::string("no error");
        };
        std::string live = msg(x + (7 << 20)), unaligned = msg(x + 100);
        EXPECT(live.find("Could not allocate CUDA storage at exact address 0x") == 0,
               "inside a live block: %s", live.c_str());
        EXPECT(unaligned.find("mallocWithAddress: addr must be aligned to kMinBlockSize (512 "
                              "bytes), got 0x") == 0,
               "unaligned: %s", unaligned.c_str());
        a.raw_delete(y);
        stats_equal(a, "after allocations at an address");
        std::printf("ok allocateWithAddress: the block at the address, torch's errors "
                    "otherwise%s\n",
                    CACHEALLOC_TORCH_ALLOCATE_WITH_ADDRESS ? "" : " (this torch has no such virtual)");
    }

    // ------ torch.cuda.MemPool(allocator=...): segments from that allocator
    {
        PoolCalls calls;
        auto pa = std::make_shared<PoolAllocator>(
            [&calls](size_t size, int, cudaStream_t) -> void* {
                if (calls.inside) calls.inside();
                calls.allocs++;
                calls.live += size;
                calls.next -= size;
                return reinterpret_cast<void*>(calls.next);
            },
            [&calls](void*, size_t size, int, cudaStream_t) {
                calls.frees++;
                calls.live -= size;
            });
        c10::MempoolId_t own{0, 11};
        a.createOrIncrefPool(0, own, pa);  // MemPool(allocator=pa)
        EXPECT(pa.use_count() == 2, "the pool keeps the allocator (%ld)", pa.use_count());
        a.beginAllocateToPool(0, own, [](cudaStream_t) { return true; });
        void* x = self.alloc(19 << 20, 0, stream);
        void* y = self.alloc(19 << 20, 0, stream);
        EXPECT(calls.allocs == 2 && calls.live == size_t(40) << 20,
               "two 20 MiB segments from the pool's allocator (%d, %zu)", calls.allocs, calls.live);
        EXPECT(reinterpret_cast<uintptr_t>(y) < reinterpret_cast<uintptr_t>(x),
               "the second segment lies below the first");
        a.raw_delete(x);
        a.raw_delete(y);
        // Two free 20 MiB blocks: torch 2.11 takes the lowest address (y's),
        // 2.12 on the oldest segment (x's).
        void* z = self.alloc(19 << 20, 0, stream);
        const char* v = std::getenv("CACHEALLOC_TORCH_VERSION");
        bool by_address = v != nullptr && std::string(v).rfind("2.11", 0) == 0;
        EXPECT(z == (by_address ? y : x), "the block order of torch %s", v ? v : "?");
        EXPECT(calls.allocs == 2, "from the cache: no third segment");
        // A call back into cachealloc from the pool's allocator is refused,
        // not a deadlock.
        calls.inside = [&] { self.alloc(1 << 20, 0, stream); };
        bool refused = false;
        try {
            self.alloc(40 << 20, 0, stream);
        } catch (const c10::Error& e) {
            refused = std::string(e.what()).find("must not allocate through cachealloc") !=
                      std::string::npos;
        }
        EXPECT(refused, "a call back into cachealloc from the pool's allocator throws");
        calls.inside = nullptr;
        a.endAllocateToPool(0, own);
        a.releasePool(0, own);  // use_mem_pool's exit
        a.raw_delete(z);
        a.emptyCache(own);
        EXPECT(calls.frees == 0, "kept while the MemPool lives");
        a.releasePool(0, own);  // ~MemPool
        a.emptyCache(own);
        EXPECT(calls.frees == 2 && calls.live == 0, "both segments back to it (%d frees)",
               calls.frees);
        EXPECT(a.getPoolUseCount(0, own) == 0, "the pool is gone");
        EXPECT(pa.use_count() == 1, "and lets the allocator go (%ld)", pa.use_count());
        bool exists = false;
        a.createOrIncrefPool(0, own, nullptr);
        try {
            a.createOrIncrefPool(0, own, pa);
        } catch (const c10::Error& e) {
            exists = std::string(e.what()).find("allocator of its own must be new") !=
                     std::string::npos;
        }
        EXPECT(exists, "an allocator for a pool that exists is refused");
        EXPECT(pa.use_count() == 1, "and not kept (%ld)", pa.use_count());
        a.releasePool(0, own);
        a.emptyCache(own);
        std::printf("ok torch.cuda.MemPool(allocator=...): %d segments from torch's pluggable "
                    "allocator, blocks in torch %s's order, %d given back, the allocator "
                    "released with the pool; a call back into cachealloc throws\n",
                    calls.allocs, v ? v : "?", calls.frees);
    }

    // ---------------------------------------------- history and snapshot
    a.recordHistory(true, nullptr, 0, CA::RecordContext::NEVER, false, {});
    EXPECT(a.isHistoryEnabled(), "history on");
    void* h = self.alloc(1 << 20, 0, stream);
    a.recordAnnotation({{"name", "phase"}, {"stage", "START"}});
    a.raw_delete(h);
    // Bookkeeping walks record no snapshot entry.
    a.checkPoolLiveAllocations(0, pool, {});
    a.getExpandableSegmentSizes(0);
    auto snap = a.snapshot({0, 0}, true);
    size_t allocs = 0, snapshots = 0;
    for (const auto& e : snap.device_traces.at(0)) {
        allocs += e.action_ == CDA::TraceEntry::ALLOC;
        snapshots += e.action_ == CDA::TraceEntry::SNAPSHOT;
        // For test_native.py: the entries, times in microseconds (time_.t_).
        std::printf("trace %d %zu %zu %lld\n", int(e.action_), e.addr_, e.size_,
                    (long long)e.time_.t_);
    }
    EXPECT(allocs == 1, "one alloc in the history (%zu)", allocs);
    EXPECT(snapshots == 1, "only the snapshot itself recorded one (%zu)", snapshots);
    EXPECT(snap.external_annotations.size() == 1 &&
               snap.external_annotations[0].metadata_.at("stage") == "START",
           "the annotation's metadata");
    EXPECT(snap.config_metadata.max_split_size == (size_t(64) << 20), "settings");
    // The segments and blocks, for test_native.py to compare with the file.
    if (cachealloc_snapshot(-1, argv[1]) != 0) {
        std::fprintf(stderr, "cachealloc_snapshot: %s\n", cachealloc_last_error());
        failures++;
    }
    auto snap2 = a.snapshot({0, 0}, false);
    for (const auto& s : snap2.segments) {
        std::printf("segment %zu %zu %zu %zu %zu %d %d", s.address, s.total_size,
                    s.allocated_size, s.active_size, s.requested_size, int(s.is_large),
                    int(s.device));
        for (const auto& b : s.blocks) {
            std::printf(" %zu:%zu:%s", b.size, b.requested_size,
                        b.allocated ? "active_allocated"
                                    : (b.active ? "active_pending_free" : "inactive"));
        }
        std::printf("\n");
    }
    a.recordHistory(false, nullptr, 0, CA::RecordContext::NEVER, false, {});

    // ------------- exceptions of torch's callbacks reach the caller, not Rust
    auto live = a.getDeviceStats(0).allocation[0].current;
    c10::MempoolId_t throwing{8, 1};
    a.beginAllocateToPool(0, throwing, [](cudaStream_t) -> bool {
        throw std::runtime_error("a filter that throws");
    });
    bool filter_threw = false;
    try {
        self.alloc(1 << 20, 0, stream);
    } catch (const std::runtime_error& e) {
        filter_threw = std::string(e.what()) == "a filter that throws";
    }
    a.endAllocateToPool(0, throwing);
    a.releasePool(0, throwing);
    EXPECT(filter_threw, "the filter's exception reaches the caller");
    EXPECT(a.getDeviceStats(0).allocation[0].current == live, "and nothing is left allocated");
    a.attachOutOfMemoryObserver([](int64_t, size_t, size_t, size_t) {
        throw std::runtime_error("an observer that throws");
    });
    bool observer_threw = false;
    try {
        self.alloc(size_t(3) << 30, 0, stream);
    } catch (const std::runtime_error& e) {
        observer_threw = std::string(e.what()) == "an observer that throws";
    }
    EXPECT(observer_threw, "an OOM observer's exception reaches the caller");
    EXPECT(ooms == 2, "the other observer ran too (%d)", ooms);
    std::printf("ok exceptions of a stream filter and of an OOM observer reach the caller, "
                "never the C library's frames\n");

    // ---- an exception inside a callback of the C library: thrown to the
    // caller once the C call returned, nothing leaked, the process lives
    auto allocated = [&] { return a.getDeviceStats(0).allocated_bytes[0].current; };
    auto bad_alloc_from = [&](const char* where, int after, auto&& call) {
        fault_at = where;
        fault_after = after;
        bool caught = false;
        try {
            call();
        } catch (const std::bad_alloc&) {
            caught = true;
        }
        EXPECT(fault_at == nullptr, "%s: the callback ran (%d more to go)", where, fault_after);
        fault_at = nullptr;
        return caught;
    };
    auto before = allocated();
    a.recordHistory(true, nullptr, 0, CA::RecordContext::NEVER, false, {});
    void* walked = self.alloc(1 << 20, 0, stream);
    EXPECT(bad_alloc_from("snapshot segment", 1, [&] { a.snapshot({0, 0}, true); }),
           "a segment visitor's bad_alloc reaches the caller");
    EXPECT(bad_alloc_from("snapshot block", 2, [&] { a.snapshot({0, 0}, true); }),
           "a block visitor's bad_alloc reaches the caller");
    EXPECT(bad_alloc_from("snapshot trace", 0, [&] { a.snapshot({0, 0}, true); }),
           "a trace visitor's bad_alloc reaches the caller");
    EXPECT(bad_alloc_from("expandable segment sizes", 0, [&] { a.getExpandableSegmentSizes(0); }),
           "getExpandableSegmentSizes' visitor's bad_alloc reaches the caller");
    EXPECT(bad_alloc_from("pool live allocations segment", 0,
                          [&] { a.checkPoolLiveAllocations(0, {0, 0}, {}); }),
           "checkPoolLiveAllocations' visitor's bad_alloc reaches the caller");
    EXPECT(bad_alloc_from("pool live allocations block", 0,
                          [&] { a.checkPoolLiveAllocations(0, {0, 0}, {}); }),
           "checkPoolLiveAllocations' block visitor's bad_alloc reaches the caller");
    EXPECT(a.snapshot({0, 0}, true).segments.size() > 0, "and a snapshot works after them");
    a.raw_delete(walked);
    a.recordHistory(false, nullptr, 0, CA::RecordContext::NEVER, false, {});
    EXPECT(allocated() == before, "allocated bytes unchanged (%lld, was %lld)",
           (long long)allocated(), (long long)before);
    std::printf("ok a snapshot visitor that throws std::bad_alloc (segment, block, trace, "
                "expandable sizes, live allocations' segment and block): the caller gets it, "
                "nothing leaks\n");

    // The restore's callback: what the restore made is handed back.
    c10::MempoolId_t rewound{6, 0};
    a.beginAllocateToPool(0, rewound, [](cudaStream_t) { return true; });
    void* r1 = self.alloc(1 << 20, 0, stream);
    void* r2 = self.alloc(2 << 20, 0, stream);
    a.endAllocateToPool(0, rewound);
#if CACHEALLOC_TORCH_POOL_RESERVED_STATS
    EXPECT(bad_alloc_from("pool reserved statistics", 0, [&] { a.getDeviceStats(0); }),
           "getDeviceStats' pool statistics callback's bad_alloc reaches the caller");
#endif
    auto rewind_to = a.getCheckpointState(0, rewound);
    a.raw_delete(r1);
    a.beginAllocateToPool(0, rewound, [](cudaStream_t) { return true; });
    void* r3 = self.alloc(1 << 20, 0, stream);
    a.endAllocateToPool(0, rewound);
    auto live_before = allocated();
    EXPECT(bad_alloc_from("restore on_block (allocated)", 0,
                          [&] { a.setCheckpointPoolState(0, rewind_to); }),
           "the restore's callback's bad_alloc reaches the caller");
    // The restore freed the pool's live allocations (r2, r3) and made the
    // checkpoint's (r1, r2), which nobody owns: they were freed.
    EXPECT(a.checkPoolLiveAllocations(0, rewound, {}), "nothing the restore made is live");
    EXPECT(allocated() == live_before - (3 << 20), "allocated bytes %lld, expected %lld",
           (long long)allocated(), (long long)(live_before - (3 << 20)));
    // torch never got the delta: the storages of r2 and r3 still have
    // their deleters. Their frees are absorbed, not refused (which would
    // throw inside a deleter and abort) nor passed on.
    bool refused = false;
    try {
        a.raw_delete(r2);
        a.raw_delete(r3);
    } catch (const c10::Error&) {
        refused = true;
    }
    EXPECT(!refused, "the stale owners' frees are absorbed");
    EXPECT(allocated() == live_before - (3 << 20), "and free nothing (%lld)",
           (long long)allocated());
    auto redo = a.setCheckpointPoolState(0, rewind_to);  // and it works again
    EXPECT(redo.dataptrs_allocd.size() == 2 && redo.ptrs_freed.empty(),
           "a second restore made %zu, freed %zu", redo.dataptrs_allocd.size(),
           redo.ptrs_freed.size());
    // A trace tracker that throws inside the restore, before any on_block:
    // the pointers it freed are still recorded, and their owners' frees
    // (redo's DataPtrs) absorbed.
    auto before_tracker = allocated();
    EXPECT(bad_alloc_from("trace tracker", 0, [&] { a.setCheckpointPoolState(0, rewind_to); }),
           "a trace tracker's bad_alloc inside a restore reaches the caller");
    EXPECT(a.checkPoolLiveAllocations(0, rewound, {}), "nothing the failed restore made is live");
    redo.dataptrs_allocd.clear();  // a refused free here would abort (a deleter)
    EXPECT(allocated() == before_tracker - (3 << 20), "allocated bytes %lld, expected %lld",
           (long long)allocated(), (long long)(before_tracker - (3 << 20)));
    a.releasePool(0, rewound);
    a.releasePool(0, rewound);
    a.emptyCache(rewound);
    EXPECT(allocated() == before, "allocated bytes back to %lld (%lld)", (long long)before,
           (long long)allocated());
    std::printf("ok a restore callback that throws std::bad_alloc: the caller gets it, what "
                "the restore made is handed back, the frees of what it freed are absorbed\n");

    // torch's context recorder (Python stacks) that throws: nothing is
    // allocated (the context is gathered first, as PyTorch does).
    a.recordHistory(true, []() -> std::shared_ptr<c10::GatheredContext> {
        throw std::runtime_error("a context recorder that throws");
    }, 100, CA::RecordContext::ALLOC, false, {});
    bool recorder_threw = false;
    try {
        self.alloc(1 << 20, 0, stream);
    } catch (const std::runtime_error& e) {
        recorder_threw = std::string(e.what()) == "a context recorder that throws";
    }
    a.recordHistory(false, nullptr, 0, CA::RecordContext::NEVER, false, {});
    EXPECT(recorder_threw, "the recorder's exception reaches the caller");
    EXPECT(allocated() == before, "allocated bytes unchanged (%lld, was %lld)",
           (long long)allocated(), (long long)before);
    std::printf("ok a context recorder that throws: the caller gets it, nothing is allocated\n");

    // A routing ended behind the C++ allocator's back (a C call): its
    // endAllocateToPool fails, and gives its filter's slot back all the same.
    for (int k = 0; k < 70; k++) {
        c10::MempoolId_t p{100 + static_cast<uint64_t>(k), 0};
        a.beginAllocateToPool(0, p, [](cudaStream_t) { return false; });
        cachealloc_end_allocate_to_pool(0, p.first, p.second);
        bool ended = false;
        try {
            a.endAllocateToPool(0, p);
        } catch (const c10::Error&) {
            ended = true;
        }
        EXPECT(ended, "endAllocateToPool of a routing already ended fails");
        a.releasePool(0, p);
        a.emptyCache({0, 0});  // the pool, with no user left, goes
    }
    std::printf("ok a failed endAllocateToPool gives its filter's slot back (70 routings, 64 "
                "slots)\n");

    // The memory fraction reads back whichever front end set it.
    cachealloc_set_memory_fraction(0.5, 0);
    EXPECT(a.getMemoryFraction(0) == 0.5, "set through C: torch reads %f", a.getMemoryFraction(0));
    a.setMemoryFraction(0.25, 0);
    EXPECT(cachealloc_get_memory_fraction(0) == 0.25, "set through torch: C reads %f",
           cachealloc_get_memory_fraction(0));
    a.setMemoryFraction(1.0, 0);
    EXPECT(a.getMemoryFraction(0) == 1.0, "1.0: %f", a.getMemoryFraction(0));
    std::printf("ok getMemoryFraction equals the fraction set through either front end\n");

    // ------------------------------------------------------------- IPC
    auto shared = a.shareIpcHandle(ptrs[0]);
    EXPECT(shared.handle.size() == 66 && shared.handle[0] == 2 && shared.handle[1] == 'c',
           "PyTorch's handle layout (%zu bytes)", shared.handle.size());
    a.raw_delete(ptrs[0]);  // no share is held: the free goes through
    EXPECT(cachealloc_free_checked(ptrs[0], 0, -1, nullptr) == -1, "freed once");

    for (size_t i = 1; i < ptrs.size(); i++)
        if (i != 2 && i != 5) a.raw_delete(ptrs[i]);
    a.resetPeakStats(0);
    a.resetAccumulatedStats(0);
    a.emptyCache({0, 0});
    stats_equal(a, "after the resets and empty_cache");
    EXPECT(a.getDeviceStats(0).reserved_bytes[0].current == 0, "everything released");

    if (failures) {
        std::printf("native_driver: %d failures\n", failures);
        return 1;
    }
    std::printf("native_driver: all checks passed\n");
    return 0;
}

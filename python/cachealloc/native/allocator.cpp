// cachealloc as torch's own CUDA allocator: an implementation of
// c10::cuda::CUDACachingAllocator::CUDAAllocator (every virtual method of
// the installed torch's header) over libcachealloc's C functions. Installed
// where torch keeps its current allocator, it is as native to torch as
// torch's own: torch.cuda.memory_stats(), memory_summary(), the history and
// snapshots, torch.OutOfMemoryError, cuDNN's benchmark (cacheInfo), CUDA
// graphs' stream filter and IPC all go through it.
//
// Built by cachealloc.install() against the torch it runs in (torch's C++
// interface changes between versions; version differences are guarded with
// TORCH_VERSION_MAJOR / MINOR). No Python headers: the library exports
// plain C entry points (cachealloc_torch_*), loaded with ctypes.

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

#include <cuda_runtime_api.h>

// Interface parts that came with a torch version: the build
// (cachealloc/native.py) passes what it found in the installed header;
// without it, the version decides (seen: absent in 2.11, present in 2.15).
#ifndef CACHEALLOC_TORCH_OOM_REJECTION
#define CACHEALLOC_TORCH_OOM_REJECTION (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 12)
#endif
#ifndef CACHEALLOC_TORCH_OOM_REJECTION_STAT
#define CACHEALLOC_TORCH_OOM_REJECTION_STAT (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 12)
#endif
#ifndef CACHEALLOC_TORCH_POOL_RESERVED_STATS
#define CACHEALLOC_TORCH_POOL_RESERVED_STATS (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 13)
#endif
#ifndef CACHEALLOC_TORCH_ALLOCATE_WITH_ADDRESS
#define CACHEALLOC_TORCH_ALLOCATE_WITH_ADDRESS (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 13)
#endif
#ifndef CACHEALLOC_TORCH_MARK_CAPTURE
#define CACHEALLOC_TORCH_MARK_CAPTURE (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 13)
#endif

#include <array>
#include <atomic>
#include <exception>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cachealloc.h"

// The pieces, one file each, included into this one translation unit.
#include "c_calls.h"       // calling the C library: errors, callbacks' exceptions
#include "ipc_handle.h"    // torch's shareable-handle layout
#include "snapshot_walk.h" // the C library's snapshot walk into torch's SnapshotInfo

namespace cachealloc_torch {

static void local_raw_delete(void* ptr);

// Calls of a MemPool's allocator under way on this thread (see PoolSource).
static thread_local int in_pool_source = 0;

class CacheallocAllocator final : public CA::CUDAAllocator {
   public:
    CacheallocAllocator() {
        // One C observer forwards every final out-of-memory to torch's.
        check(cachealloc_attach_oom_observer(&CacheallocAllocator::on_oom, this),
              "attaching the out-of-memory observer");
#if CACHEALLOC_TORCH_OOM_REJECTION
        check(cachealloc_attach_oom_rejection_observer(&CacheallocAllocator::on_rejection, this),
              "attaching the OOM rejection observer");
#endif
    }

    // ------------------------------------------------------ allocation

    c10::DataPtr allocate(size_t size) override {
        c10::DeviceIndex device = 0;
        C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
        cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
        void* ptr = alloc(size, device, stream);
        return {ptr, ptr, &local_raw_delete, c10::Device(c10::DeviceType::CUDA, device)};
    }

    c10::DeleterFnPtr raw_deleter() const override { return &local_raw_delete; }

    void copy_data(void* dest, const void* src, std::size_t count) const final {
        C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyKind::cudaMemcpyDeviceToDevice));
    }

    void* raw_alloc(size_t nbytes) override {
        if (nbytes == 0) return nullptr;
        c10::DeviceIndex device = 0;
        C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
        cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
        return alloc(nbytes, device, stream);
    }

    void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
        if (nbytes == 0) return nullptr;
        c10::DeviceIndex device = 0;
        C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
        return alloc(nbytes, device, stream);
    }

    // Run one allocating C call with the context (torch's Python stacks)
    // gathered before it, as PyTorch does (a recorder that throws leaves
    // nothing allocated), and kept for the block after; what a filter,
    // observer or tracker threw during the call is rethrown, the block
    // given back. The pointer, or NULL with the C library's error.
    template <typename Call>
    void* with_context(int device, Call&& call) {
        std::shared_ptr<c10::GatheredContext> context;
        if (recording_context_) context = gather_context();
        void* ptr = call();
        if (pending_exception) {
            if (ptr != nullptr) cachealloc_free_checked(ptr, 0, device, nullptr);
            rethrow_pending();
        }
        if (ptr != nullptr && context) keep_context(ptr, std::move(context), device);
        return ptr;
    }

    // The allocation itself, on an explicit device (the tests' way in:
    // no CUDA runtime call).
    void* alloc(size_t size, int device, cudaStream_t stream) {
        if (size == 0) return nullptr;
        if (in_pool_source != 0) refuse_reentry("an allocation");
        void* ptr = with_context(device, [&] { return cachealloc_alloc(size, device, stream); });
        if (ptr != nullptr) return ptr;
        std::string msg = last_error("no message");
        if (cachealloc_last_error_code() == CACHEALLOC_ERROR_OUT_OF_MEMORY) {
            // torch's OOM observers already ran (on_oom, inside the call).
            TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
        }
        TORCH_CHECK(false, "cachealloc: allocation of ", size, " bytes on device ", device,
                    " failed: ", msg);
    }

#if CACHEALLOC_TORCH_ALLOCATE_WITH_ADDRESS
    // torch 2.13's allocateWithAddress (UntypedStorage._resize_with_addr_):
    // the block at exactly `addr`, carved out of the free block holding it,
    // or torch's error.
    c10::DataPtr allocateWithAddress(size_t size, void* addr) override {
        c10::DeviceIndex device = 0;
        C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
        cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
        void* ptr = alloc_at(size, device, stream, addr);
        return {ptr, ptr, &local_raw_delete, c10::Device(c10::DeviceType::CUDA, device)};
    }
#endif

    // allocateWithAddress on an explicit device (the tests' way in).
    void* alloc_at(size_t size, int device, cudaStream_t stream, void* addr) {
        if (in_pool_source != 0) refuse_reentry("an allocation");
        if (size == 0) return nullptr;
        void* ptr = with_context(
            device, [&] { return cachealloc_alloc_at(size, device, stream, addr); });
        if (ptr != nullptr) return ptr;
        // torch's messages ("Could not allocate CUDA storage at exact
        // address 0x...", "mallocWithAddress: addr must be aligned ...").
        const char* e = cachealloc_last_error();
        TORCH_CHECK(e == nullptr, e);
        return nullptr;  // 0 bytes
    }

    void raw_delete(void* ptr) override {
        if (ptr == nullptr) return;
        if (in_pool_source != 0) refuse_reentry("a free");
        if (absorbing_.load(std::memory_order_acquire) && absorbed(ptr)) return;
        forget_context(ptr);
        check(cachealloc_free_checked(ptr, 0, -1, nullptr), "free");
    }

    // ------------------------------------------------------- lifecycle

    void init(int device_count) override {
        cachealloc_init(device_count);
        check_void("init (the CACHEALLOC_* settings)");
        initialized_ = true;
    }

    bool initialized() override { return initialized_; }

    void enable(bool value) override { enabled_ = value; }

    bool isEnabled() const override { return enabled_; }

    std::string name() override { return "cachealloc"; }

    // ---------------------------------------------------------- limits

    // Read from the C library, which keeps the limit: a fraction set
    // through either front end (torch, cachealloc's Python or C) reads back.
    double getMemoryFraction(c10::DeviceIndex device) override {
        double fraction = cachealloc_get_memory_fraction(device);
        if (fraction < 0) fail("get_per_process_memory_fraction");
        return fraction;
    }

    void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
        cachealloc_set_memory_fraction(fraction, device);
        check_void("set_per_process_memory_fraction");
    }

    std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
        size_t free = 0, total = 0;
        check(cachealloc_mem_get_info(device, &free, &total), "memory info");
        return {free, total};
    }

    // ------------------------------------------------------ statistics

    CDA::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
        cachealloc_device_stats s;
        check(cachealloc_get_device_stats(device, &s), "memory_stats");
        CDA::DeviceStats d;
        copy_array(d.allocation, s.allocation);
        copy_array(d.segment, s.segment);
        copy_array(d.active, s.active);
        copy_array(d.inactive_split, s.inactive_split);
        copy_array(d.allocated_bytes, s.allocated_bytes);
        copy_array(d.reserved_bytes, s.reserved_bytes);
        copy_array(d.active_bytes, s.active_bytes);
        copy_array(d.inactive_split_bytes, s.inactive_split_bytes);
        copy_array(d.requested_bytes, s.requested_bytes);
        d.num_alloc_retries = s.num_alloc_retries;
        d.num_ooms = s.num_ooms;
#if CACHEALLOC_TORCH_OOM_REJECTION_STAT
        d.num_oom_rejections = s.num_oom_rejections;
#endif
#if CACHEALLOC_TORCH_POOL_RESERVED_STATS
        check(cachealloc_pool_reserved_stats(
                  device,
                  [](uint64_t id0, uint64_t id1, const cachealloc_stat* arr,
                     void* user) noexcept {
                      // The map's insertion allocates (std::bad_alloc).
                      shielded("pool reserved statistics", [&] {
                          auto& pools = static_cast<CDA::DeviceStats*>(user)
                                            ->reserved_bytes_by_private_pools;
                          auto& out =
                              pools[c10::MempoolId_t{static_cast<c10::CaptureId_t>(id0),
                                                     static_cast<c10::CaptureId_t>(id1)}];
                          for (size_t i = 0; i < 3; i++) {
                              out[i].current = arr[i].current;
                              out[i].peak = arr[i].peak;
                              out[i].allocated = arr[i].allocated;
                              out[i].freed = arr[i].freed;
                          }
                      });
                  },
                  &d),
              "pool_reserved_stats");
#endif
        copy_stat(d.oversize_allocations, s.oversize_allocations);
        copy_stat(d.oversize_segments, s.oversize_segments);
        d.num_sync_all_streams = s.num_sync_all_streams;
        d.num_device_alloc = s.num_device_alloc;
        d.num_device_free = s.num_device_free;
        d.max_split_size = s.max_split_size;
        return d;
    }

    void resetAccumulatedStats(c10::DeviceIndex device) override {
        check(cachealloc_reset_accumulated_stats(device), "reset_accumulated_memory_stats");
    }

    void resetPeakStats(c10::DeviceIndex device) override {
        check(cachealloc_reset_peak_stats(device), "reset_peak_memory_stats");
    }

    // PyTorch's: a zero *largestBlock is first guessed as the device's free
    // memory; then the largest cached block, if larger (cuDNN sizes its
    // benchmark workspace from it).
    void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
        if (*largestBlock == 0) {
            check(cachealloc_mem_get_info(device, largestBlock, nullptr), "cacheInfo");
        }
        size_t largest = 0;
        check(cachealloc_cache_info(device, nullptr, &largest), "cacheInfo");
        if (largest > *largestBlock) *largestBlock = largest;
    }

    // ------------------------------------------------------- the cache

    void emptyCache(c10::MempoolId_t mempool_id) override {
        if (mempool_id.first == 0 && mempool_id.second == 0) {
            check(cachealloc_empty_cache(-1), "empty_cache");
        } else {
            check(cachealloc_empty_cache_pool(-1, mempool_id.first, mempool_id.second),
                  "empty_cache of a pool");
        }
    }

    void* getBaseAllocation(void* ptr, size_t* size) override {
        void* base = cachealloc_base_alloc(ptr, size);
        if (base == nullptr) fail("getBaseAllocation");
        return base;
    }

    void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
        // As PyTorch: nothing for an empty tensor or memory not ours (a
        // received IPC storage).
        if (!ptr.get() || ptr.get_deleter() != &local_raw_delete) return;
        cachealloc_record_stream(ptr.get(), stream.stream());
        check_void("record_stream");
    }

    std::vector<CA::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
        struct Ctx {
            std::vector<CA::StreamSegmentSize> out;
        } ctx;
        cachealloc_snapshot_visitor v{};
        v.segment = [](const cachealloc_segment_info* s, void* user) noexcept {
            shielded("expandable segment sizes", [&] {
                auto* c = static_cast<Ctx*>(user);
                if (s->is_expandable) {
                    c->out.emplace_back(static_cast<cudaStream_t>(s->stream), s->is_large == 0,
                                        s->total_size);
                }
            });
        };
        check(cachealloc_snapshot_walk(device, CACHEALLOC_WALK_QUIET, &v, &ctx),
              "getExpandableSegmentSizes");
        return ctx.out;
    }

    // ----------------------------------------------------- private pools

    void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                             std::function<bool(cudaStream_t)> filter) override {
        FilterSlot* slot = take_slot(device, mempool_id, std::move(filter));
        int rc = cachealloc_begin_allocate_to_pool_filtered(
            device, mempool_id.first, mempool_id.second, &CacheallocAllocator::call_filter, slot);
        if (rc != 0) {
            std::string msg = last_error("no message");
            give_back_slot(slot);
            TORCH_CHECK(false, "cachealloc: beginAllocateToPool failed: ", msg);
        }
    }

#if CACHEALLOC_TORCH_MARK_CAPTURE
    // torch 2.13's capture count: CUDAGraph::capture_begin marks a capture
    // apart from the routing (beginAllocateToPool), which alone
    // (use_mem_pool) is no capture from this release on.
    void markCaptureBegin(c10::DeviceIndex device) override {
        check(cachealloc_mark_capture_begin(device), "markCaptureBegin");
    }

    void markCaptureEnd(c10::DeviceIndex device) override {
        check(cachealloc_mark_capture_end(device), "markCaptureEnd");
    }
#endif

    void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
        // This routing's slot, found before the routing ends: a routing to
        // the same pool begun right after it gets a slot of its own.
        FilterSlot* mine = nullptr;
        {
            std::lock_guard<std::mutex> lock(slots_mutex_);
            for (auto& s : slots_) {
                if (s.used && s.device == device && s.id == mempool_id) {
                    mine = &s;
                    break;
                }
            }
        }
        cachealloc_end_allocate_to_pool(device, mempool_id.first, mempool_id.second);
        std::string msg = last_error("");
        // The routing is gone from the device either way (the call fails
        // only when there was none, or on a failed device, which calls
        // nothing again): nothing calls its filter now.
        if (mine != nullptr) give_back_slot(mine);
        TORCH_CHECK(msg.empty(), "cachealloc: endAllocateToPool failed: ", msg);
    }

    // torch.cuda.MemPool(): a pool with a user, nothing routed to it yet.
    // torch.cuda.MemPool(allocator=...): a new pool whose segments come from
    // that allocator's raw_alloc / raw_delete, as torch's PrivatePool calls
    // them (NCCL's ncclMemAlloc, a CUDAPluggableAllocator); the allocator
    // is kept until the pool is deleted.
    void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                            std::shared_ptr<CA::CUDAAllocator> allocator) override {
        if (allocator == nullptr || allocator.get() == this) {
            check(cachealloc_create_pool(device, mempool_id.first, mempool_id.second, 0, 0),
                  "createOrIncrefPool");
            return;
        }
        auto* holder = new PoolSource{std::move(allocator)};
        cachealloc_segment_source source{&CacheallocAllocator::source_alloc,
                                         &CacheallocAllocator::source_free,
                                         &CacheallocAllocator::source_release, holder};
        int rc = cachealloc_create_pool_with_source(device, mempool_id.first, mempool_id.second,
                                                    0, 0, &source);
        if (rc != 0) delete holder;  // not kept: no release will come
        check(rc, "createOrIncrefPool");
    }

    int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
        int64_t n = cachealloc_pool_use_count(device, mempool_id.first, mempool_id.second);
        if (n < 0) fail("getPoolUseCount");
        return static_cast<int>(n);
    }

    void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override {
        check(cachealloc_set_pool_use_on_oom(device, mempool_id.first, mempool_id.second,
                                             use_on_oom ? 1 : 0),
              "setUseOnOOM");
    }

    void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
        check(cachealloc_set_pool_no_split(device, mempool_id.first, mempool_id.second),
              "setNoSplit");
    }

    void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
        cachealloc_release_pool(device, mempool_id.first, mempool_id.second);
        check_void("releasePool");
    }

    bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                  const std::unordered_set<void*>& expected) override {
        struct Ctx {
            c10::MempoolId_t id;
            bool in_pool = false;
            size_t live = 0;
            const std::unordered_set<void*>* expected;
            bool ok = true;
        } ctx{mempool_id, false, 0, &expected, true};
        cachealloc_snapshot_visitor v{};
        v.segment = [](const cachealloc_segment_info* s, void* user) noexcept {
            shielded("pool live allocations segment", [&] {
                auto* c = static_cast<Ctx*>(user);
                c->in_pool = s->pool_id0 == c->id.first && s->pool_id1 == c->id.second;
            });
        };
        v.block = [](const cachealloc_block_info* b, void* user) noexcept {
            shielded("pool live allocations block", [&] {
                auto* c = static_cast<Ctx*>(user);
                if (!c->in_pool || !b->allocated) return;
                c->live++;
                if (!c->expected->count(reinterpret_cast<void*>(b->address))) c->ok = false;
            });
        };
        check(cachealloc_snapshot_walk(device, CACHEALLOC_WALK_QUIET, &v, &ctx),
              "checkPoolLiveAllocations");
        return ctx.ok && ctx.live == expected.size();
    }

    // cudagraph trees: a private pool's layout, to rewind it to later.
    struct CheckpointState final : CA::AllocatorState {
        c10::DeviceIndex device = 0;
        c10::MempoolId_t id{0, 0};
        std::vector<cachealloc_checkpoint_block> blocks;
    };

    std::shared_ptr<CA::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                           c10::MempoolId_t id) override {
        auto state = std::make_shared<CheckpointState>();
        state->device = device;
        state->id = id;
        int64_t n = 0;
        do {  // sized, then filled (again if the pool grew in between)
            state->blocks.resize(static_cast<size_t>(n));
            n = cachealloc_checkpoint_pool(device, id.first, id.second, state->blocks.data(),
                                           state->blocks.size());
            if (n < 0) fail("getCheckpointState");
        } while (static_cast<size_t>(n) > state->blocks.size());
        state->blocks.resize(static_cast<size_t>(n));
        return state;
    }

    CA::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                               std::shared_ptr<CA::AllocatorState> pps) override {
        auto* state = dynamic_cast<CheckpointState*>(pps.get());
        TORCH_CHECK(state != nullptr, "cachealloc: setCheckpointPoolState was given a state that "
                                      "cachealloc's getCheckpointState did not make");
        TORCH_CHECK(state->device == device, "cachealloc: a checkpoint of device ", state->device,
                    " restored on device ", device);
        struct Ctx {
            CA::CheckpointDelta delta;
            c10::DeviceIndex device;
            CacheallocAllocator* self;
        } ctx{{}, device, this};
        // Room first, so that the callbacks, which run once the restore has
        // changed the pool, need no allocation: the restore makes one
        // allocation per allocated block of the checkpoint, and frees at
        // most every block the pool has now.
        size_t made = 0;
        for (const auto& b : state->blocks) made += b.allocated != 0;
        int64_t now = cachealloc_checkpoint_pool(device, state->id.first, state->id.second,
                                                 nullptr, 0);
        if (now < 0) fail("setCheckpointPoolState");
        ctx.delta.dataptrs_allocd.reserve(made);
        ctx.delta.ptrs_freed.reserve(static_cast<size_t>(now));
        auto on_block = [](void* ptr, size_t, int allocated, void* user) noexcept {
            auto* c = static_cast<Ctx*>(user);
            if (allocated) {
                bool kept = shielded("restore on_block (allocated)", [&] {
                    c->delta.dataptrs_allocd.emplace_back(
                        ptr, ptr, &local_raw_delete, c10::Device(c10::DeviceType::CUDA, c->device));
                });
                // An allocation nobody will own is handed back at once (the
                // ones kept before go back with the delta as the exception
                // unwinds).
                if (!kept) cachealloc_free_checked(ptr, 0, c->device, nullptr);
            } else {
                // Recorded even after another callback threw: its owner
                // must be told, or its later free be absorbed (below).
                try {
                    c->self->forget_context(ptr);
                } catch (...) {
                    keep_exception();
                }
                auto& freed = c->delta.ptrs_freed;
                if (freed.size() < freed.capacity()) {
                    freed.push_back(ptr);
                } else {
                    shielded("restore on_block (freed)", [&] { freed.push_back(ptr); });
                }
            }
        };
        int rc = cachealloc_restore_pool(device, state->id.first, state->id.second,
                                         state->blocks.data(), state->blocks.size(), on_block,
                                         &ctx);
        if (rc == 0 && pending_exception) {
            // The restore went through, but torch will not get the delta:
            // the storages it would have taken the freed pointers from keep
            // their deleters. Their frees are absorbed (raw_delete), so a
            // stale storage's death neither frees memory it no longer owns
            // nor aborts the process on an invalid free.
            absorb_frees_of(ctx.delta.ptrs_freed);
        }
        check(rc, "setCheckpointPoolState");
        return std::move(ctx.delta);
    }

    // ------------------------------------------------ history, snapshots

    bool isHistoryEnabled() override { return history_enabled_; }

    void recordHistory(bool enabled, CA::CreateContextFn context_recorder,
                       size_t alloc_trace_max_entries, CA::RecordContext when, bool clearHistory,
                       const std::vector<std::string>& skip_actions) override {
        uint32_t skip = 0;
        for (const auto& a : skip_actions) {
            skip |= 1u << static_cast<unsigned>(CDA::parseTraceEntryAction(a));
        }
        check(cachealloc_record_history_ex(-1, enabled ? 1 : 0, alloc_trace_max_entries,
                                           clearHistory ? 1 : 0, skip),
              "record_memory_history");
        std::lock_guard<std::mutex> lock(mutex_);
        history_enabled_ = enabled;
        context_recorder_ = enabled ? context_recorder : nullptr;
        when_ = enabled ? when : CA::RecordContext::NEVER;
        recording_context_ = context_recorder_ != nullptr && when_ != CA::RecordContext::NEVER;
        if (!recording_context_) contexts_.clear();
    }

    void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
        std::string name = encode_annotation(md);
        // torch records it on the current device (every device if none is).
        c10::DeviceIndex device = -1;
        if (c10::cuda::GetDevice(&device) != cudaSuccess) {
            (void)cudaGetLastError();
            device = -1;
        }
        check(cachealloc_record_annotation(device, name.c_str()), "record_annotation");
    }

    CA::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override {
        SnapshotWalk w;
        w.pool = mempool_id;
        w.all_pools = mempool_id.first == 0 && mempool_id.second == 0;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            w.contexts = contexts_;
            w.when = when_;
        }
        cachealloc_snapshot_visitor v{};
        v.segment = &SnapshotWalk::segment;
        v.block = &SnapshotWalk::block;
        v.trace_entry = &SnapshotWalk::trace;
        check(cachealloc_snapshot_walk(-1, include_traces ? CACHEALLOC_WALK_TRACES : 0, &v, &w),
              "snapshot");
        w.info.config_metadata = allocator_settings();
        // Stacks go on the last `alloc` entry of each live allocation (an
        // older one at a reused address belonged to someone else), and only
        // when torch asked for them in the history (ALLOC or ALL).
        if (w.when >= CA::RecordContext::ALLOC) {
            std::unordered_set<size_t> done;
            for (auto it = w.traces.rbegin(); it != w.traces.rend(); ++it) {
                if (it->action_ != CDA::TraceEntry::ALLOC || !done.insert(it->addr_).second) continue;
                auto c = w.contexts.find(reinterpret_cast<void*>(it->addr_));
                if (c != w.contexts.end()) it->context_ = c->second;
            }
        }
        int devices = std::max<int>(w.devices, c10::cuda::device_count());
        w.info.device_traces.resize(std::max(devices, 1));
        for (auto& e : w.traces) {
            w.info.device_traces.at(e.device_).push_back(std::move(e));
        }
        return std::move(w.info);
    }

    void attachOutOfMemoryObserver(CA::OutOfMemoryObserver observer) override {
        TORCH_CHECK(oom_observers_.add(std::move(observer)), "cachealloc: ",
                    oom_observers_.capacity, " out-of-memory observers are attached already");
    }

#if CACHEALLOC_TORCH_OOM_REJECTION
    // Observers of allocations the rejection policy (throw_on_cudamalloc_oom)
    // refused before any device call: called once the device's lock is
    // released, on the allocating thread.
    void attachOomRejectionObserver(CA::OomRejectionObserver observer) override {
        TORCH_CHECK(rejection_observers_.add(std::move(observer)), "cachealloc: ",
                    rejection_observers_.capacity, " OOM rejection observers are attached already");
    }
#endif

    void attachAllocatorTraceTracker(CA::AllocatorTraceTracker tracker) override {
        TORCH_CHECK(trackers_.add(std::move(tracker)), "cachealloc: ", trackers_.capacity,
                    " trace trackers are attached already");
        // One C tracker calls them all, attached once (tried again after a failure).
        std::lock_guard<std::mutex> once(tracker_attach_mutex_);
        if (!tracker_attached_) {
            check(cachealloc_attach_trace_tracker(&CacheallocAllocator::on_trace, this),
                  "attachAllocatorTraceTracker");
            tracker_attached_ = true;
        }
    }

    // ------------------------------------------------- IPC and copies

    CA::ShareableHandle shareIpcHandle(void* ptr) override {
        cachealloc_ipc_handle h;
        if (cachealloc_share_ipc_handle(ptr, &h) != 0) {
            if (cachealloc_last_error_code() != CACHEALLOC_ERROR_EXPANDABLE_SEGMENT)
                fail("shareIpcHandle");
            return share_pages(ptr);
        }
        // torch keeps the memory alive (its ref-counted sent data), not the
        // allocator: no share is held here.
        check(cachealloc_release_ipc_share(ptr), "shareIpcHandle (release)");
        return CA::ShareableHandle{static_cast<ptrdiff_t>(h.offset), handle_string(h)};
    }

    // A block of an expandable segment: torch's 'e' handle of the pages
    // that hold it (their descriptors stay this process's while mapped).
    CA::ShareableHandle share_pages(void* ptr) {
        std::vector<int> fds(64);
        cachealloc_ipc_pages p{};
        int rc = cachealloc_share_ipc_pages(ptr, fds.data(), fds.size(), &p);
        if (rc != 0) {
            // Too few descriptors: `p.pages` says how many.
            if (cachealloc_last_error_code() != CACHEALLOC_ERROR_BUFFER_TOO_SMALL)
                fail("shareIpcHandle (pages)");
            fds.resize(p.pages);
            check(cachealloc_share_ipc_pages(ptr, fds.data(), fds.size(), &p),
                  "shareIpcHandle (pages)");
        }
        check(cachealloc_release_ipc_share(ptr), "shareIpcHandle (release)");
        return CA::ShareableHandle{static_cast<ptrdiff_t>(p.offset), pages_string(p, fds.data())};
    }

    std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
        int device = c10::cuda::current_device();
        if (is_pages_string(handle)) {
            std::vector<int> fds;
            cachealloc_ipc_pages p = parse_pages_string(handle, fds);
            void* base = cachealloc_open_ipc_pages(&p, fds.data(), device);
            if (base == nullptr) fail("getIpcDevPtr (expandable segment)");
            return std::shared_ptr<void>(base, [p, fds, device](void*) {
                cachealloc_close_ipc_pages(&p, fds.data(), device);
                pending_exception = nullptr;  // a deleter reports nothing
            });
        }
        cachealloc_ipc_handle h = parse_handle_string(handle);
        void* p = cachealloc_open_ipc_handle(&h, device);
        if (p == nullptr) fail("getIpcDevPtr");
        return std::shared_ptr<void>(p, [h, device](void*) {
            cachealloc_close_ipc_handle(&h, device);
            pending_exception = nullptr;  // a deleter reports nothing
        });
    }

    void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
        check(cachealloc_enable_peer_access(dev, dev_to_access), "enablePeerAccess");
    }

    cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                            cudaStream_t stream, bool p2p_enabled) override {
        check(cachealloc_memcpy_async(dst, dstDevice, src, srcDevice, count, stream,
                                      p2p_enabled ? 1 : 0),
              "memcpyAsync");
        return cudaSuccess;
    }

   private:
    // A pool routing's filter, at a fixed address (the C library keeps one
    // record per (function, user) pair: a fixed table keeps them few).
    struct FilterSlot {
        bool used = false;
        c10::DeviceIndex device = 0;
        c10::MempoolId_t id{0, 0};
        std::function<bool(cudaStream_t)> filter;
    };

    // A filter that throws refuses the stream.
    // A MemPool's allocator, as the C library calls it (with the device's
    // lock held: a call back into cachealloc from it would wait for
    // itself, so alloc() and raw_delete() refuse one, see in_pool_source).
    struct PoolSource {
        std::shared_ptr<CA::CUDAAllocator> allocator;
    };
    struct InPoolSource {
        InPoolSource() { ++in_pool_source; }
        ~InPoolSource() { --in_pool_source; }
    };
    static void* source_alloc(size_t size, int, void*, void* user) noexcept {
        void* ptr = nullptr;
        // An exception (the allocator's own out-of-memory) is kept and
        // rethrown when the allocation returns, as torch lets it out.
        shielded("MemPool allocator raw_alloc", [&] {
            InPoolSource inside;
            ptr = static_cast<PoolSource*>(user)->allocator->raw_alloc(size);
        });
        return ptr;
    }
    static void source_free(void* ptr, size_t, int, void*, void* user) noexcept {
        shielded("MemPool allocator raw_delete", [&] {
            InPoolSource inside;
            static_cast<PoolSource*>(user)->allocator->raw_delete(ptr);
        });
    }
    static void source_release(void* user) noexcept { delete static_cast<PoolSource*>(user); }
    static void refuse_reentry(const char* what) {
        TORCH_CHECK(in_pool_source == 0, "cachealloc: ", what,
                    " called from the allocator of a MemPool while cachealloc is getting "
                    "memory from it: that allocator must not allocate through cachealloc "
                    "(it would wait for itself)");
    }

    static int call_filter(void* stream, void* user) noexcept {
        auto* slot = static_cast<FilterSlot*>(user);
        bool accept = false;
        shielded("stream filter", [&] {
            accept = slot->filter && slot->filter(static_cast<cudaStream_t>(stream));
        });
        return accept ? 1 : 0;
    }

    FilterSlot* take_slot(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::function<bool(cudaStream_t)> filter) {
        std::lock_guard<std::mutex> lock(slots_mutex_);
        for (auto& s : slots_) {
            if (!s.used) {
                s.used = true;
                s.device = device;
                s.id = id;
                s.filter = std::move(filter);
                return &s;
            }
        }
        TORCH_CHECK(false, "cachealloc: more than ", slots_.size(),
                    " pools routed to at once");
    }

    void give_back_slot(FilterSlot* slot) {
        std::lock_guard<std::mutex> lock(slots_mutex_);
        slot->used = false;
        slot->filter = nullptr;
    }

    static void on_oom(int device, size_t alloc_size, size_t device_total, size_t device_free,
                       void* user) noexcept {
        auto* self = static_cast<CacheallocAllocator*>(user);
        shielded("out-of-memory observer", [&] {
            self->oom_observers_.each(
                [&](const CA::OutOfMemoryObserver& o) { o(device, alloc_size, device_total, device_free); });
        });
    }

#if CACHEALLOC_TORCH_OOM_REJECTION
    // torch runs these on a thread of their own and logs what they throw
    // instead of passing it on; so does this (the allocation fails with the
    // rejection's OutOfMemoryError either way).
    static void on_rejection(int device, size_t alloc_size, size_t total_allocated,
                             size_t device_total, void* user) noexcept {
        auto* self = static_cast<CacheallocAllocator*>(user);
        self->rejection_observers_.each([&](const CA::OomRejectionObserver& o) {
            // The warning itself may throw (Python's warnings as errors):
            // nothing gets out.
            try {
                try {
                    o(device, alloc_size, total_allocated, device_total);
                } catch (const std::exception& e) {
                    TORCH_WARN("Exception in OOM rejection observer: ", e.what());
                } catch (...) {
                    TORCH_WARN("Unknown exception in OOM rejection observer");
                }
            } catch (...) {
            }
        });
    }
#endif

    static void on_trace(const cachealloc_trace_entry* e, void* user) noexcept {
        auto* self = static_cast<CacheallocAllocator*>(user);
        if (e->action > static_cast<int>(CDA::TraceEntry::OOM)) return;  // annotations
        // Under the device's lock, at every entry: the list is read with no
        // lock of its own.
        shielded("trace tracker", [&] {
            CDA::TraceEntry te(static_cast<CDA::TraceEntry::Action>(e->action),
                               static_cast<c10::DeviceIndex>(e->device), e->addr, e->size,
                               e->stream, c10::MempoolId_t{e->pool_id0, e->pool_id1},
                               c10::getApproximateTime());
            self->trackers_.each([&](const CA::AllocatorTraceTracker& t) { t(te); });
        });
    }

    // torch's context recorder's answer (null when it is off).
    std::shared_ptr<c10::GatheredContext> gather_context() {
        CA::CreateContextFn recorder;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            recorder = context_recorder_;
        }
        return recorder ? recorder() : nullptr;
    }

    // Keep `context` for the allocation at `ptr`; if that throws, the
    // allocation is freed before the exception goes on (and what a
    // callback threw during that free is dropped: the first one wins).
    void keep_context(void* ptr, std::shared_ptr<c10::GatheredContext> context, int device) {
        try {
            std::lock_guard<std::mutex> lock(mutex_);
            contexts_[ptr] = std::move(context);
        } catch (...) {
            cachealloc_free_checked(ptr, 0, device, nullptr);
            pending_exception = nullptr;
            throw;
        }
    }

    // The next raw_delete of each of `ptrs` does nothing (a restore that
    // failed after it freed them: see setCheckpointPoolState). If the
    // address is handed out again meanwhile, whichever of its two frees
    // comes first is the absorbed one and the second frees it: once, and
    // only when both owners are done.
    void absorb_frees_of(const std::vector<void*>& ptrs) noexcept {
        try {
            std::lock_guard<std::mutex> lock(mutex_);
            for (void* p : ptrs) absorb_.insert(p);
            absorbing_.store(!absorb_.empty(), std::memory_order_release);
        } catch (...) {
            // No memory to remember them: their frees will be refused as
            // any invalid free is.
        }
    }

    // Whether `ptr`'s free is one to absorb (and it no longer is).
    bool absorbed(void* ptr) noexcept {
        std::lock_guard<std::mutex> lock(mutex_);
        bool found = absorb_.erase(ptr) != 0;
        absorbing_.store(!absorb_.empty(), std::memory_order_release);
        return found;
    }

    void forget_context(void* ptr) noexcept {
        if (!recording_context_) return;
        std::lock_guard<std::mutex> lock(mutex_);
        contexts_.erase(ptr);
    }

    std::atomic<bool> initialized_{false};
    std::atomic<bool> enabled_{true};
    std::atomic<bool> history_enabled_{false};
    std::atomic<bool> recording_context_{false};
    std::atomic<bool> absorbing_{false};

    std::mutex mutex_;
    AttachedCallbacks<CA::OutOfMemoryObserver> oom_observers_;
#if CACHEALLOC_TORCH_OOM_REJECTION
    AttachedCallbacks<CA::OomRejectionObserver> rejection_observers_;
#endif
    AttachedCallbacks<CA::AllocatorTraceTracker> trackers_;
    CA::CreateContextFn context_recorder_ = nullptr;
    CA::RecordContext when_ = CA::RecordContext::NEVER;
    std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts_;
    std::unordered_set<void*> absorb_;  // see absorb_frees_of

    std::mutex tracker_attach_mutex_;
    bool tracker_attached_ = false;

    std::mutex slots_mutex_;
    std::array<FilterSlot, 64> slots_;
};

// The process's one instance (torch keeps raw pointers to it for good).
static std::shared_ptr<CacheallocAllocator>& instance() {
    static auto* a = new std::shared_ptr<CacheallocAllocator>(std::make_shared<CacheallocAllocator>());
    return *a;
}

static void local_raw_delete(void* ptr) { instance()->raw_delete(ptr); }

}  // namespace cachealloc_torch

// ------------------------------------------------------------ C entry points

namespace {

// Copy `msg` into the caller's buffer.
void put(char* buf, size_t len, const std::string& msg) {
    if (buf == nullptr || len == 0) return;
    size_t n = std::min(len - 1, msg.size());
    std::memcpy(buf, msg.data(), n);
    buf[n] = '\0';
}

}  // namespace

extern "C" {

// The allocator object (a c10::cuda::CUDACachingAllocator::CUDAAllocator*),
// for tests that drive it directly; NULL if it cannot be made.
__attribute__((visibility("default"))) void* cachealloc_torch_allocator() {
    try {
        return static_cast<c10::cuda::CUDACachingAllocator::CUDAAllocator*>(
            cachealloc_torch::instance().get());
    } catch (...) {
        return nullptr;
    }
}

// Make it torch's CUDA allocator (what torch.cuda.memory.change_current_allocator
// does). Returns 0, or -1 with the reason in `err`.
__attribute__((visibility("default"))) int cachealloc_torch_install(char* err, size_t len) {
    try {
        torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(cachealloc_torch::instance());
        return 0;
    } catch (const std::exception& e) {
        put(err, len, e.what());
        return -1;
    }
}

// The torch version this library was built against ("2.11.0").
__attribute__((visibility("default"))) const char* cachealloc_torch_built_against() {
    return TORCH_VERSION;
}

}  // extern "C"

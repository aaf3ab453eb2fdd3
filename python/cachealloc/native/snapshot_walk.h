#pragma once
// A snapshot of the C library (cachealloc_snapshot_walk) as torch's
// SnapshotInfo: segments, blocks, history, annotations, settings. Part of the C++ allocator for torch (allocator.cpp includes it; it needs
// the headers allocator.cpp includes first).

namespace cachealloc_torch {

namespace CA = c10::cuda::CUDACachingAllocator;
namespace CDA = c10::CachingDeviceAllocator;

// Annotations: torch's metadata pairs, kept in the C library's name as
// KEY \x1f VALUE \x1e ... after a marker, and read back in snapshots.
constexpr const char* kAnnotationMarker = "\x1d" "torch:";

static std::string encode_annotation(const std::vector<std::pair<std::string, std::string>>& md) {
    std::string s = kAnnotationMarker;
    for (const auto& [k, v] : md) {
        s += k;
        s += '\x1f';
        s += v;
        s += '\x1e';
    }
    return s;
}

static std::unordered_map<std::string, std::string> decode_annotation(const char* name) {
    std::unordered_map<std::string, std::string> md;
    std::string s = name ? name : "";
    const std::string marker = kAnnotationMarker;
    if (s.compare(0, marker.size(), marker) != 0) {
        md["name"] = s;
        return md;
    }
    size_t at = marker.size();
    while (at < s.size()) {
        size_t sep = s.find('\x1f', at);
        size_t end = s.find('\x1e', at);
        if (sep == std::string::npos || end == std::string::npos || sep > end) break;
        md[s.substr(at, sep - at)] = s.substr(sep + 1, end - sep - 1);
        at = end + 1;
    }
    return md;
}

// The snapshot as it is walked (cachealloc_snapshot_walk's visitor).
struct SnapshotWalk {
    CA::SnapshotInfo info;
    c10::MempoolId_t pool{0, 0};
    bool all_pools = true;
    bool keep = false;  // the segment being walked is in the snapshot
    int devices = 0;
    std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts;
    CA::RecordContext when = CA::RecordContext::NEVER;
    std::vector<CDA::TraceEntry> traces;

    // The visitors: each body is shielded (it allocates: push_back, the
    // annotations' strings).
    static void segment(const cachealloc_segment_info* s, void* user) noexcept {
        shielded("snapshot segment", [&] { static_cast<SnapshotWalk*>(user)->on_segment(s); });
    }

    static void block(const cachealloc_block_info* b, void* user) noexcept {
        shielded("snapshot block", [&] { static_cast<SnapshotWalk*>(user)->on_block(b); });
    }

    static void trace(const cachealloc_trace_entry* e, void* user) noexcept {
        shielded("snapshot trace", [&] { static_cast<SnapshotWalk*>(user)->on_trace(e); });
    }

    void on_segment(const cachealloc_segment_info* s) {
        auto* w = this;
        w->devices = std::max(w->devices, s->device + 1);
        w->keep = w->all_pools || (s->pool_id0 == w->pool.first && s->pool_id1 == w->pool.second);
        if (!w->keep) return;
        CDA::SegmentInfo seg;
        seg.device = static_cast<c10::DeviceIndex>(s->device);
        seg.address = static_cast<size_t>(s->address);
        seg.total_size = s->total_size;
        seg.requested_size = s->requested_size;
        seg.allocated_size = s->allocated_size;
        seg.active_size = s->active_size;
        seg.stream = s->stream;
        seg.is_large = s->is_large != 0;
        seg.is_expandable = s->is_expandable != 0;
        seg.owner_private_pool_id = {s->pool_id0, s->pool_id1};
        w->info.segments.push_back(std::move(seg));
    }

    void on_block(const cachealloc_block_info* b) {
        auto* w = this;
        if (!w->keep || w->info.segments.empty()) return;
        CDA::BlockInfo bi;
        bi.size = b->size;
        bi.requested_size = b->requested_size;
        bi.allocated = b->allocated != 0;
        bi.active = b->active != 0;
        if (bi.allocated) {
            auto it = w->contexts.find(reinterpret_cast<void*>(b->address));
            if (it != w->contexts.end()) bi.context_when_allocated = it->second;
        }
        w->info.segments.back().blocks.push_back(std::move(bi));
    }

    void on_trace(const cachealloc_trace_entry* e) {
        auto* w = this;
        w->devices = std::max(w->devices, e->device + 1);
        auto device = static_cast<c10::DeviceIndex>(e->device);
        // A snapshot holds times as microseconds in time_.t_ (torch's
        // allocator converts its approximate clock when it takes one):
        // the C library's are microseconds already.
        if (e->action > static_cast<int>(CDA::TraceEntry::OOM)) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
            CDA::AnnotationEntry a(device, 0);
            a.time_.t_ = static_cast<time_t>(e->time_us);
            for (auto& [k, v] : decode_annotation(e->annotation)) a.recordUserMetadata(k, v);
            w->info.external_annotations.push_back(std::move(a));
#endif
            return;
        }
        w->traces.emplace_back(static_cast<CDA::TraceEntry::Action>(e->action), device,
                               static_cast<size_t>(e->addr), e->size, e->stream,
                               c10::MempoolId_t{e->pool_id0, e->pool_id1}, 0);
        w->traces.back().time_.t_ = static_cast<time_t>(e->time_us);
    }
};

// The allocator's settings as torch's AllocatorConfigInfo.
inline CA::AllocatorConfigInfo allocator_settings() {
    cachealloc_allocator_settings s;
    check(cachealloc_get_allocator_settings(&s), "allocator settings");
    CA::AllocatorConfigInfo c;
    c.garbage_collection_threshold = s.garbage_collection_threshold;
    c.max_split_size = s.max_split_size;
    c.pinned_num_register_threads = s.pinned_num_register_threads;
    c.expandable_segments = s.expandable_segments != 0;
    c.release_lock_on_malloc = s.release_lock_on_malloc != 0;
    c.pinned_use_host_register = s.pinned_use_host_register != 0;
    c.graph_capture_record_stream_reuse = s.graph_capture_record_stream_reuse != 0;
    c.last_allocator_settings = s.last_allocator_settings ? s.last_allocator_settings : "";
    c.roundup_power2_divisions.assign(std::begin(s.roundup_power2_divisions),
                                      std::end(s.roundup_power2_divisions));
    return c;
}


}  // namespace cachealloc_torch

#pragma once
// torch's shareable IPC handle: the string torch sends to another process.
// 'c' (a cudaMalloc segment): version, 'c', the driver's 64-byte handle.
// 'e' (pages of an expandable segment): version, 'e', torch's ShareHeader
// (2.11, 2.12: version 2, {int32 pid, 4 bytes padding, uint64 segment
// size, uint64 page count}; 2.13 on: version 3, the same plus {int32
// handle type, 4 bytes padding}, 1 = POSIX file descriptor), then one
// int32 descriptor of the sender per page (docs/expandable-ipc-notes.md).
// Part of the C++ allocator for torch (allocator.cpp includes it; it needs
// the headers allocator.cpp includes first).

namespace cachealloc_torch {

namespace CA = c10::cuda::CUDACachingAllocator;
namespace CDA = c10::CachingDeviceAllocator;

// The first byte of a handle string (PyTorch's SHAREABLE_HANDLE_VERSION),
// then the type ('c': a cudaMalloc segment, PyTorch's
// SHAREABLE_CUDA_MALLOC), then the driver's 64-byte handle.
constexpr char kHandleVersion = 2;
constexpr char kHandleCudaMalloc = 'c';
constexpr char kHandleExpandable = 'e';
constexpr size_t kIpcHandleSize = 64;
// The newest version any torch this builds against writes (2.13 on: 3).
constexpr char kNewestHandleVersion = 3;

// An 'e' handle's header, as the torch built against writes it.
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 13
constexpr char kPagesVersion = 3;
#else
constexpr char kPagesVersion = 2;
#endif
constexpr size_t kPagesHeader2 = 24;  // pid, padding, segment size, pages
constexpr size_t kPagesHeader3 = 32;  // + handle type, padding

// Pages shared as torch's 'e' string (padding zeroed: torch 2.13 on leaves
// it unset, which only makes two shares of the same pages differ).
inline std::string pages_string(const cachealloc_ipc_pages& p, const int* fds,
                                char version = kPagesVersion) {
    std::string s;
    s.push_back(version);
    s.push_back(kHandleExpandable);
    unsigned char header[kPagesHeader3] = {};
    int32_t pid = static_cast<int32_t>(p.pid), type = 1;
    uint64_t seg = p.page_size, n = p.pages;
    std::memcpy(header, &pid, 4);
    std::memcpy(header + 8, &seg, 8);
    std::memcpy(header + 16, &n, 8);
    std::memcpy(header + 24, &type, 4);
    s.append(reinterpret_cast<const char*>(header), version >= 3 ? kPagesHeader3 : kPagesHeader2);
    s.append(reinterpret_cast<const char*>(fds), sizeof(int32_t) * p.pages);
    return s;
}

// Whether `handle` is an 'e' string.
inline bool is_pages_string(const std::string& handle) {
    return handle.size() >= 2 && handle[1] == kHandleExpandable && handle[0] >= 2 &&
           handle[0] <= kNewestHandleVersion;
}

// torch's 'e' string (version 2 or 3) as cachealloc's pages and the
// sender's descriptors (offset 0: torch adds the block's offset itself).
inline cachealloc_ipc_pages parse_pages_string(const std::string& handle, std::vector<int>& fds) {
    TORCH_CHECK(is_pages_string(handle), "cachealloc: not an expandable segment's handle");
    size_t header = handle[0] >= 3 ? kPagesHeader3 : kPagesHeader2;
    TORCH_CHECK(handle.size() >= 2 + header, "cachealloc: a truncated expandable segment handle");
    const char* h = handle.data() + 2;
    int32_t pid = 0, type = 1;
    uint64_t seg = 0, n = 0;
    std::memcpy(&pid, h, 4);
    std::memcpy(&seg, h + 8, 8);
    std::memcpy(&n, h + 16, 8);
    if (header == kPagesHeader3) std::memcpy(&type, h + 24, 4);
    TORCH_CHECK(type == 1 || type == 0,
                "cachealloc: an expandable segment shared with fabric handles (type ", type,
                "): cachealloc imports POSIX file descriptors only");
    TORCH_CHECK(n > 0 && n <= (handle.size() - 2 - header) / 4 &&
                    handle.size() == 2 + header + 4 * n,
                "cachealloc: an expandable segment handle of ", n, " pages in ", handle.size(),
                " bytes");
    fds.resize(n);
    std::memcpy(fds.data(), h + header, 4 * n);
    cachealloc_ipc_pages p{};
    p.pid = static_cast<uint32_t>(pid);
    p.pages = static_cast<uint32_t>(n);
    p.page_size = seg;
    p.offset = 0;
    return p;
}


// cachealloc's handle as torch's string: version, type, the driver's handle.
inline std::string handle_string(const cachealloc_ipc_handle& h) {
    std::string handle;
    handle.push_back(kHandleVersion);
    handle.push_back(kHandleCudaMalloc);
    handle.append(reinterpret_cast<const char*>(h.handle), kIpcHandleSize);
    return handle;
}

// torch's string (this layout, or a bare 64-byte driver handle, which older
// torch's StorageSharing sent) as cachealloc's handle of the segment's base.
inline cachealloc_ipc_handle parse_handle_string(const std::string& handle) {
    cachealloc_ipc_handle h{};
    const char* bytes = handle.data();
    if (handle.size() == kIpcHandleSize) {
        // A bare driver handle.
    } else if (handle.size() == kIpcHandleSize + 2 && handle[0] <= kNewestHandleVersion &&
               handle[1] == kHandleCudaMalloc) {
        bytes += 2;
    } else {
        TORCH_CHECK(handle.size() >= 2 && handle[0] <= kNewestHandleVersion,
                    "cachealloc: received a shareable handle from a newer torch");
        TORCH_CHECK(false, "cachealloc: an ill-formed shareable handle (type ",
                    static_cast<int>(handle.size() >= 2 ? handle[1] : 0), ")");
    }
    std::memcpy(h.handle, bytes, kIpcHandleSize);
    h.offset = 0;
    return h;
}

}  // namespace cachealloc_torch

#pragma once
// torch's shareable IPC handle: the string torch sends to another process
// (PyTorch's SHAREABLE_HANDLE_VERSION 2 layout). Part of the C++ allocator for torch (allocator.cpp includes it; it needs
// the headers allocator.cpp includes first).

namespace cachealloc_torch {

namespace CA = c10::cuda::CUDACachingAllocator;
namespace CDA = c10::CachingDeviceAllocator;

// The first byte of a handle string (PyTorch's SHAREABLE_HANDLE_VERSION),
// then the type ('c': a cudaMalloc segment, PyTorch's
// SHAREABLE_CUDA_MALLOC), then the driver's 64-byte handle.
constexpr char kHandleVersion = 2;
constexpr char kHandleCudaMalloc = 'c';
constexpr size_t kIpcHandleSize = 64;


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
    } else if (handle.size() == kIpcHandleSize + 2 && handle[0] <= kHandleVersion &&
               handle[1] == kHandleCudaMalloc) {
        bytes += 2;
    } else {
        TORCH_CHECK(handle.size() >= 2 && handle[0] <= kHandleVersion,
                    "cachealloc: received a shareable handle from a newer torch");
        TORCH_CHECK(false,
                    "cachealloc: this handle shares an expandable segment, which cachealloc "
                    "cannot open; the sending process should use expandable_segments:False");
    }
    std::memcpy(h.handle, bytes, kIpcHandleSize);
    h.offset = 0;
    return h;
}

}  // namespace cachealloc_torch

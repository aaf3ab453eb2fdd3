// cachealloc's allocation for torch's CUDAPluggableAllocator, raising as
// torch's own allocator does: a failed allocation throws
// c10::OutOfMemoryError (torch.OutOfMemoryError in Python) with PyTorch's
// message and cachealloc's verdict, or c10::Error for any other failure,
// instead of handing torch a NULL (which becomes a tensor at address 0).
// torch calls these through its alloc / free function pointers, from its
// own C++ frames, so the exception reaches the Python caller. It needs only
// c10's headers and libc10, which every torch build carries (CUDA and
// ROCm): cachealloc's Python package builds it (native.py,
// build_pluggable) for the pluggable path, and falls back to the library's
// cachealloc_pluggable_alloc (which aborts) only where nothing compiles.
#include <c10/util/Exception.h>

#include <cstddef>
#include <string>

#include "cachealloc.h"

#define CACHEALLOC_ENTRY extern "C" __attribute__((visibility("default")))

// torch's MallocFuncType: void* (size_t, int, cudaStream_t).
CACHEALLOC_ENTRY void* cachealloc_torch_pluggable_alloc(size_t size, int device, void* stream) {
    void* ptr = cachealloc_alloc(size, device, stream);
    if (ptr != nullptr || size == 0) return ptr;
    const char* e = cachealloc_last_error();
    std::string msg = e ? e : "no message";
    if (cachealloc_last_error_code() == CACHEALLOC_ERROR_OUT_OF_MEMORY) {
        // The out-of-memory observers already ran, inside the call.
        C10_THROW_ERROR(OutOfMemoryError, msg);
    }
    C10_THROW_ERROR(Error, "cachealloc: allocation of " + std::to_string(size) +
                               " bytes on device " + std::to_string(device) + " failed: " + msg);
}

// torch's FreeFuncType: void (void*, size_t, int, cudaStream_t). A free
// never throws (torch calls it from deleters).
CACHEALLOC_ENTRY void cachealloc_torch_pluggable_free(void* ptr, size_t size, int device,
                                                      void* stream) noexcept {
    cachealloc_free(ptr, size, device, stream);
}

// Which torch headers it was built against (a check for the loader).
CACHEALLOC_ENTRY int cachealloc_torch_pluggable_version(void) noexcept { return 1; }

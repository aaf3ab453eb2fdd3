// The stand-in torch's CUDAPluggableAllocator::malloc and its Python
// binding's exception translation (python/tests/test_ctypes.py): calls the
// alloc function torch was given and reports what it threw, by kind, for
// the Python side to raise torch.OutOfMemoryError or RuntimeError.
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdio>

typedef void* (*alloc_fn)(size_t, int, void*);

// 0: *out holds the pointer; 1: c10::OutOfMemoryError; 2: c10::Error;
// 3: anything else. The message goes to `msg`.
extern "C" __attribute__((visibility("default"))) int stand_in_alloc(void* fn, size_t size,
                                                                     int device, void* stream,
                                                                     void** out, char* msg,
                                                                     size_t cap) {
    try {
        *out = reinterpret_cast<alloc_fn>(fn)(size, device, stream);
        return 0;
    } catch (const c10::OutOfMemoryError& e) {
        std::snprintf(msg, cap, "%s", e.what());
        return 1;
    } catch (const c10::Error& e) {
        std::snprintf(msg, cap, "%s", e.what());
        return 2;
    } catch (...) {
        std::snprintf(msg, cap, "an exception of another type");
        return 3;
    }
}

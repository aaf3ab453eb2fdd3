#pragma once
// Calling the C library from C++: its last error as an exception, and
// exceptions of torch's callbacks kept until the C call returns. Part of the C++ allocator for torch (allocator.cpp includes it; it needs
// the headers allocator.cpp includes first).

namespace cachealloc_torch {

namespace CA = c10::cuda::CUDACachingAllocator;
namespace CDA = c10::CachingDeviceAllocator;

// An exception thrown by torch code that the C library called back (a
// stream filter, an OOM observer, a trace tracker) must not unwind through
// its Rust frames: it is caught there, kept here, and rethrown once the C
// call has returned, on the same thread.
static thread_local std::exception_ptr pending_exception;

static void keep_exception() {
    if (!pending_exception) pending_exception = std::current_exception();
}

static void rethrow_pending() {
    if (pending_exception) {
        auto e = pending_exception;
        pending_exception = nullptr;
        std::rethrow_exception(e);
    }
}

// The C library's last error on this thread, or `fallback`.
static std::string last_error(const char* fallback) {
    const char* e = cachealloc_last_error();
    return e ? std::string(e) : std::string(fallback);
}

// Throw c10::Error (torch's RuntimeError) with the C library's message.
[[noreturn]] static void fail(const char* what) {
    TORCH_CHECK(false, "cachealloc: ", what, " failed: ", last_error("no message"));
}

// After a C call: rethrow what a callback threw during it, else throw if
// it failed.
static void check(int status, const char* what) {
    rethrow_pending();
    if (status != 0) fail(what);
}

// After a void C call: the same.
static void check_void(const char* what) {
    rethrow_pending();
    if (cachealloc_last_error() != nullptr) fail(what);
}

static void copy_stat(CDA::Stat& to, const cachealloc_stat& from) {
    to.current = from.current;
    to.peak = from.peak;
    to.allocated = from.allocated;
    to.freed = from.freed;
}

static void copy_array(CDA::StatArray& to, const cachealloc_stat (&from)[3]) {
    for (size_t i = 0; i < 3; i++) copy_stat(to[i], from[i]);
}


}  // namespace cachealloc_torch

#pragma once
// Calling the C library from C++: its last error as an exception, and
// exceptions of the callbacks it runs kept until the C call returns. Part
// of the C++ allocator for torch (allocator.cpp includes it; it needs the
// headers allocator.cpp includes first).

namespace cachealloc_torch {

namespace CA = c10::cuda::CUDACachingAllocator;
namespace CDA = c10::CachingDeviceAllocator;

// An exception thrown by C++ code that the C library called back (torch's
// stream filter, OOM observer or trace tracker, a snapshot visitor building
// torch's structures, a restore's callback) must not unwind through its
// Rust frames: that would abort the process ("Rust cannot catch foreign
// exceptions"). Every callback handed to the C library runs its body
// through `shielded`: the exception is caught there, kept here, and
// rethrown once the C call has returned, on the same thread
// (rethrow_pending, which check() and check_void() call first).
static thread_local std::exception_ptr pending_exception;

static void keep_exception() noexcept {
    if (!pending_exception) pending_exception = std::current_exception();
}

// A test seam: a test build defines it to throw inside a named callback
// (python/tests/native_driver.cpp); nothing in a normal build.
#ifndef CACHEALLOC_CALLBACK_FAULT
#define CACHEALLOC_CALLBACK_FAULT(where) ((void)0)
#endif

// Run `body` as (part of) a callback of the C library, named `where`: an
// exception it throws is kept for rethrow_pending, never let out. Once one
// is kept, later callbacks of the same C call do nothing (their work is
// lost with the call, which reports the first exception). Returns whether
// `body` ran to its end.
template <typename Body>
static bool shielded(const char* where, Body&& body) noexcept {
    if (pending_exception) return false;
    try {
        CACHEALLOC_CALLBACK_FAULT(where);
        body();
        return true;
    } catch (...) {
        keep_exception();
        return false;
    }
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

// Callbacks torch attaches (trace trackers, OOM observers), at most N:
// attached under a lock, called without one (a trace tracker runs at every
// history entry of every device).
template <typename F, size_t N = 64>
class AttachedCallbacks {
   public:
    // False when N are attached already.
    bool add(F f) {
        std::lock_guard<std::mutex> lock(adding_);
        size_t n = count_.load(std::memory_order_relaxed);
        if (n == N) return false;
        slots_[n] = std::move(f);
        count_.store(n + 1, std::memory_order_release);
        return true;
    }

    template <typename Call>
    void each(Call&& call) const {
        size_t n = count_.load(std::memory_order_acquire);
        for (size_t i = 0; i < n; i++) call(slots_[i]);
    }

    static constexpr size_t capacity = N;

   private:
    std::array<F, N> slots_;
    std::atomic<size_t> count_{0};
    std::mutex adding_;
};

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

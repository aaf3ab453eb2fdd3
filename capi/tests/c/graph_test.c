/*
 * libcachealloc inside a host runtime that calls back (a Python process)
 * and captures CUDA graphs. Built and run by capi/tests/capi.rs:
 *
 *   graph_test mock|cuda|hip
 *
 * - an out-of-memory observer that calls back into the library on the
 *   failing device (memory_stats, record_annotation, cache_info, an
 *   allocation) returns: observers run after the device's lock is
 *   released (an alarm ends the program if it deadlocks);
 * - a panic inside a device's lock fails that device for good (every call
 *   on it says so) while another device works on;
 * - with `cuda` or `hip` (the project's stub driver, which enforces the
 *   capture rules): what torch.cuda.graph does, in its order, through the
 *   pluggable allocator's entry points: warm-up on a side stream,
 *   synchronize, empty_cache, begin_allocate_to_pool then
 *   cudaStreamBeginCapture (global mode), allocations with new segments,
 *   frees, record_stream on a stream that joined the capture, a free of a
 *   block used on another stream, cudaStreamEndCapture then
 *   end_allocate_to_pool, instantiate and replay, release_pool,
 *   empty_cache. The capture must never be invalidated. Run once per
 *   CACHEALLOC_CONF (the Rust side runs it with expandable segments too).
 *
 * Prints `ok WHAT` per check and exits 1 at the first failure.
 */
#define _GNU_SOURCE
#include "cachealloc.h"
#include "check.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* ------------------------------------------- an observer that calls back */

typedef struct {
    int calls, annotated;
    int64_t ooms_seen, allocated_seen;
    size_t cached;
    void *allocated_inside;
} reentrant_seen;

static reentrant_seen seen;

/* What a Python observer does: read the statistics, record an annotation,
 * ask for the cache, even allocate, on the device that just failed. */
static void reentrant_observer(int device, size_t alloc_size, size_t total, size_t free_bytes,
                               void *user) {
    (void)alloc_size;
    (void)total;
    (void)free_bytes;
    reentrant_seen *s = user;
    s->calls++;
    s->ooms_seen = stat(device, "num_ooms");
    s->allocated_seen = stat(device, "allocated_bytes.all.current");
    s->annotated = cachealloc_record_annotation(device, "inside the OOM observer") == 0;
    size_t largest = 0;
    CHECK(cachealloc_cache_info(device, &s->cached, &largest) == 0, "cache_info in the observer");
    s->allocated_inside = cachealloc_alloc(4096, device, NULL);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL: deadlock (no progress in 60 s)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(3);
}

/* On a device of 1 GiB (the Rust side sets the simulated one's; main sets
 * the stub driver's). */
static void observer_calls_back(void) {
    CHECK(cachealloc_attach_oom_observer(reentrant_observer, &seen) == 0, "attach");
    void *held = cachealloc_alloc(4 * MIB, 0, NULL);
    CHECK(held, "alloc");
    int64_t before = stat(0, "num_ooms");
    void *p = cachealloc_alloc((size_t)2 << 30, 0, NULL);
    CHECK(p == NULL && error_has("out of memory"), "the failing allocation (%s)", last_error());
    CHECK(seen.calls == 1, "the observer ran once (%d)", seen.calls);
    CHECK(seen.ooms_seen == before + 1, "it saw the OOM counted (%lld)", (long long)seen.ooms_seen);
    CHECK(seen.allocated_seen >= (int64_t)(4 * MIB), "it read the statistics");
    CHECK(seen.annotated, "it recorded an annotation");
    CHECK(seen.allocated_inside != NULL, "it allocated on the same device");
    cachealloc_free(seen.allocated_inside, 4096, 0, NULL);
    cachealloc_free(held, 4 * MIB, 0, NULL);
    CHECK(no_error(), "frees");
    printf("ok an OOM observer that calls back into the same device returns\n");
}

/* -------------------------------------------------- a panic inside a lock */

static void panic_fails_the_device(void) {
#ifndef CACHEALLOC_DEBUG_HOOKS
    printf("skipped a panic inside a lock: the library has no test hooks (feature debug-hooks)\n");
    return;
#else
    void *live = cachealloc_alloc(1000, 1, NULL);
    CHECK(live, "alloc on device 1");
    CHECK(cachealloc_debug_fail_inside_lock() == 0, "arm");
    void *p = cachealloc_alloc(1000, 1, NULL);
    CHECK(p == NULL && error_has("internal error in cachealloc_alloc"), "the panicking call");
    p = cachealloc_alloc(1000, 1, NULL);
    CHECK(p == NULL && error_has("device 1 failed"), "the next call on device 1");
    CHECK(cachealloc_free_checked(live, 1000, 1, NULL) == -1 && error_has("device 1 failed"),
          "a free on device 1");
    CHECK(cachealloc_memory_stats(1, find_stat, &(stat_query){"num_ooms", 0, 0}) == -1 &&
              error_has("device 1 failed"),
          "memory_stats of device 1");
    cachealloc_record_stream(live, NULL);
    CHECK(error_has("device 1 failed"), "record_stream of a pointer of device 1");
    void *q = cachealloc_alloc(1000, 0, NULL);
    CHECK(q && no_error(), "device 0 works on");
    cachealloc_free(q, 1000, 0, NULL);
    CHECK(no_error(), "free on device 0");
    printf("ok a panic inside device 1's lock failed device 1 only: %s\n",
           "every later call on it is refused");
#endif
}

/* -------------------------------------------------- the driver, by dlsym */

typedef int (*stream_create_t)(void **, unsigned);
typedef int (*handle_t)(void *);
typedef int (*sync_t)(void);
typedef int (*begin_t)(void *, int);
typedef int (*end_t)(void *, void **);
typedef int (*record_t)(void *, void *);
typedef int (*wait_t)(void *, void *, unsigned);
typedef int (*launch_t)(void *, void *);
typedef void (*counters_t)(stub_counters *);

static int hip_mode;
static void *driver;
static struct {
    stream_create_t stream_create, event_create;
    handle_t stream_destroy, stream_sync, event_destroy, exec_destroy, graph_destroy;
    sync_t device_sync;
    begin_t begin_capture;
    end_t end_capture;
    record_t event_record;
    wait_t stream_wait;
    launch_t graph_launch;
    counters_t counters;
} drv;

static void *sym(const char *name) {
    void *f = dlsym(driver, name);
    CHECK(f, "the driver has no %s (not the project's stub?)", name);
    return f;
}

#define CU(call) CHECK((call) == 0, "%s", #call)

static void open_driver(void) {
    const char *lib = hip_mode ? "libamdhip64.so.5" : "libcuda.so.1";
    driver = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    if (!driver) driver = dlopen(lib, RTLD_NOW);
    CHECK(driver, "cannot open %s: %s", lib, dlerror());
    drv.stream_create = (stream_create_t)sym(hip_mode ? "hipStreamCreateWithFlags" : "cuStreamCreate");
    drv.event_create = (stream_create_t)sym(hip_mode ? "hipEventCreateWithFlags" : "cuEventCreate");
    drv.stream_destroy = (handle_t)sym(hip_mode ? "hipStreamDestroy" : "cuStreamDestroy_v2");
    drv.stream_sync = (handle_t)sym(hip_mode ? "hipStreamSynchronize" : "cuStreamSynchronize");
    drv.event_destroy = (handle_t)sym(hip_mode ? "hipEventDestroy" : "cuEventDestroy_v2");
    drv.exec_destroy = (handle_t)sym(hip_mode ? "hipGraphExecDestroy" : "cuGraphExecDestroy");
    drv.graph_destroy = (handle_t)sym(hip_mode ? "hipGraphDestroy" : "cuGraphDestroy");
    drv.device_sync = (sync_t)sym(hip_mode ? "hipDeviceSynchronize" : "cuCtxSynchronize");
    drv.begin_capture = (begin_t)sym(hip_mode ? "hipStreamBeginCapture" : "cuStreamBeginCapture_v2");
    drv.end_capture = (end_t)sym(hip_mode ? "hipStreamEndCapture" : "cuStreamEndCapture");
    drv.event_record = (record_t)sym(hip_mode ? "hipEventRecord" : "cuEventRecord");
    drv.stream_wait = (wait_t)sym(hip_mode ? "hipStreamWaitEvent" : "cuStreamWaitEvent");
    drv.graph_launch = (launch_t)sym(hip_mode ? "hipGraphLaunch" : "cuGraphLaunch");
    drv.counters = (counters_t)sym("cachealloc_stub_counters");
}

/* A kernel's stand-in: a memset of `n` bytes at `p` on `s`. */
static void kernel(void *p, size_t n, void *s) {
    if (hip_mode) {
        int (*f)(void *, int, size_t, void *) = (int (*)(void *, int, size_t, void *))sym("hipMemsetAsync");
        CU(f(p, 0, n, s));
    } else {
        int (*f)(uint64_t, unsigned char, size_t, void *) =
            (int (*)(uint64_t, unsigned char, size_t, void *))sym("cuMemsetD8Async");
        CU(f((uint64_t)(uintptr_t)p, 0, n, s));
    }
}

static int instantiate(void **exec, void *graph) {
    if (hip_mode) {
        int (*f)(void **, void *, void *, char *, size_t) =
            (int (*)(void **, void *, void *, char *, size_t))sym("hipGraphInstantiate");
        return f(exec, graph, NULL, NULL, 0);
    }
    int (*f)(void **, void *, unsigned long long) =
        (int (*)(void **, void *, unsigned long long))sym("cuGraphInstantiateWithFlags");
    return f(exec, graph, 0);
}

/* CUDA: make device 0's primary context current on this thread (the
 * library made the driver ready at its first call). */
static void *primary_context(void) {
    if (hip_mode) return NULL;
    int (*retain)(void **, int) = (int (*)(void **, int))sym("cuDevicePrimaryCtxRetain");
    int (*set)(void *) = (int (*)(void *))sym("cuCtxSetCurrent");
    void *ctx = NULL;
    CU(retain(&ctx, 0));
    CU(set(ctx));
    return ctx;
}

static void release_context(void) {
    if (hip_mode) return;
    int (*release)(int) = (int (*)(int))sym("cuDevicePrimaryCtxRelease_v2");
    CU(release(0));
}

/* -------------------------------------------------- torch.cuda.graph */

static void graph_capture(void) {
    /* What the failed device 1 holds for good (device 0 holds nothing). */
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache");
    stub_counters k0;
    drv.counters(&k0);
    primary_context();
    void *side = NULL, *other = NULL, *fork = NULL, *join = NULL;
    CU(drv.stream_create(&side, 1)); /* non-blocking, as PyTorch's streams */
    CU(drv.stream_create(&other, 1));
    CU(drv.event_create(&fork, 2)); /* timing disabled */
    CU(drv.event_create(&join, 2));

    /* Warm-up on the side stream, and a block used on another stream
     * whose free leaves an event pending. */
    void *w1 = cachealloc_alloc(64 * KIB, 0, side), *w2 = cachealloc_alloc(30 * MIB, 0, side);
    CHECK(w1 && w2, "warm-up allocations");
    kernel(w2, 30 * MIB, side);
    void *early = cachealloc_alloc(5 * MIB, 0, NULL);
    CHECK(early, "alloc");
    cachealloc_record_stream(early, other);
    cachealloc_free(w1, 0, 0, side);
    cachealloc_free(w2, 0, 0, side);
    CHECK(no_error(), "warm-up frees");

    /* torch.cuda.graph.__enter__: synchronize, empty_cache (the reset
     * hook empties every device: device 1 failed above, so device 0's). */
    CU(drv.device_sync());
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache");
    void *pre = cachealloc_alloc(MIB, 0, NULL);
    cachealloc_record_stream(pre, other);
    cachealloc_free(early, 0, 0, NULL);
    CHECK(pre && no_error(), "a free with an event pending");

    /* CUDAGraph::capture_begin: the pool first, then the capture. */
    cachealloc_begin_allocate_to_pool(0, 1, 0, NULL);
    CHECK(no_error(), "begin_allocate_to_pool");
    CU(drv.begin_capture(side, 0 /* global */));

    /* The forward: new segments (small, large, over 10 MiB), kernels, a
     * fork to another stream that joins the capture, record_stream on it,
     * frees and reuse inside the capture, a free of a pre-capture block. */
    void *a = cachealloc_alloc(4 * KIB, 0, side);
    CHECK(a, "a small allocation (a new segment) inside the capture");
    void *b = cachealloc_alloc(3 * MIB, 0, side);
    CHECK(b, "a large allocation (a new segment) inside the capture");
    void *c = cachealloc_alloc(12 * MIB, 0, side);
    CHECK(c, "an allocation over 10 MiB inside the capture");
    kernel(a, 4 * KIB, side);
    kernel(c, 12 * MIB, side);
    CU(drv.event_record(fork, side));
    CU(drv.stream_wait(other, fork, 0)); /* `other` joins the capture */
    kernel(b, 3 * MIB, other);
    cachealloc_record_stream(b, other);
    CHECK(no_error(), "record_stream inside the capture");
    CU(drv.event_record(join, other));
    CU(drv.stream_wait(side, join, 0)); /* and joins back */
    cachealloc_free(a, 0, 0, side);
    cachealloc_free(b, 0, 0, side);
    void *d = cachealloc_alloc(2 * KIB, 0, side);
    CHECK(d, "reuse inside the capture");
    kernel(d, 2 * KIB, side);
    cachealloc_free(pre, 0, 0, NULL);
    void *big = cachealloc_alloc(40 * MIB, 0, side);
    CHECK(big, "a segment of 40 MiB inside the capture");
    kernel(big, 40 * MIB, side);
    /* torch.cuda.empty_cache() inside a capture: nothing, no device call. */
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache inside the capture");

    /* CUDAGraph::capture_end: the capture, then the pool. */
    void *graph = NULL;
    int r = drv.end_capture(side, &graph);
    CHECK(r == 0 && graph, "the capture ended valid (%d: invalidated by a call the allocator made)", r);
    cachealloc_end_allocate_to_pool(0, 1, 0);
    CHECK(no_error(), "end_allocate_to_pool");
    stub_counters k;
    drv.counters(&k);
    CHECK(k.capture_violations == 0, "no call broke the capture's rules (%llu)",
          (unsigned long long)k.capture_violations);

    /* Instantiate and replay; the allocator settles what it deferred. */
    void *exec = NULL;
    CU(instantiate(&exec, graph));
    for (int i = 0; i < 3; i++) CU(drv.graph_launch(exec, side));
    CU(drv.stream_sync(side));
    void *after = cachealloc_alloc(4 * KIB, 0, NULL);
    CHECK(after, "after the capture");
    cachealloc_free(after, 0, 0, NULL);

    /* CUDAGraph::reset: the graph's tensors die, the pool is released. */
    cachealloc_free(c, 0, 0, side);
    cachealloc_free(d, 0, 0, side);
    cachealloc_free(big, 0, 0, side);
    cachealloc_release_pool(0, 1, 0);
    CHECK(no_error(), "release_pool");
    CU(drv.exec_destroy(exec));
    CU(drv.graph_destroy(graph));
    CU(drv.device_sync());
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache");
    CHECK(stat(0, "allocated_bytes.all.current") == 0 && stat(0, "reserved_bytes.all.current") == 0,
          "nothing allocated or reserved");
    CU(drv.event_destroy(fork));
    CU(drv.event_destroy(join));
    CU(drv.stream_destroy(side));
    CU(drv.stream_destroy(other));
    release_context();
    drv.counters(&k);
    CHECK(k.capture_violations == 0 && k.live_captures == 0 && k.live_graphs == 0 &&
              k.live_allocations == k0.live_allocations && k.live_mappings == k0.live_mappings,
          "the driver: %llu violations, %llu captures, %llu graphs, %llu allocations, %llu mappings",
          (unsigned long long)k.capture_violations, (unsigned long long)k.live_captures,
          (unsigned long long)k.live_graphs, (unsigned long long)k.live_allocations,
          (unsigned long long)k.live_mappings);
    const char *conf = getenv("CACHEALLOC_CONF");
    printf("ok graph capture (%s) never invalidated: %llu driver calls\n",
           conf && conf[0] ? conf : "default", (unsigned long long)k.calls);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s mock|cuda|hip\n", argv[0]);
        return 2;
    }
    int driver_mode = strcmp(argv[1], "mock") != 0;
    hip_mode = strcmp(argv[1], "hip") == 0;
    signal(SIGALRM, on_alarm);
    alarm(60);
    if (driver_mode) {
        open_driver();
        void (*set_capacity)(uint64_t) = (void (*)(uint64_t))sym("cachealloc_stub_set_capacity");
        set_capacity((uint64_t)1 << 30);
    }
    observer_calls_back();
    panic_fails_the_device();
    if (driver_mode) graph_capture();
    printf("graph_test: all checks passed\n");
    return 0;
}

/*
 * The C ABI of libcachealloc, from C, as PyTorch and C runtimes use it.
 * Built and run by capi/tests/capi.rs:
 *
 *   abi_test MODE ITERATIONS SNAPSHOT_DIR
 *
 * MODE is `mock` (CACHEALLOC_BACKEND=mock, CACHEALLOC_MOCK_CAPACITY=1GiB)
 * or `cuda` (CACHEALLOC_BACKEND=cuda on the project's stub driver, whose
 * capacity this program sets to 1 GiB; it has no CUDA runtime to create
 * streams with, so every stream is the default one). It prints
 * `stat KEY VALUE` for every statistic after the fixed sequence of
 * `sequence()` (the Rust side replays the same sequence on the allocator
 * and compares), `ok WHAT` per check, and exits 1 at the first failure.
 */
#define _GNU_SOURCE
#include "cachealloc.h"
#include "check.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PyTorch's function types (c10/cuda/CUDAPluggableAllocator: MallocFuncType,
 * FreeFuncType and the set_*_fn hooks), with cudaStream_t as the C ABI
 * passes it. Every entry point is assigned to them: with -Wall -Werror a
 * signature that differs does not compile. */
typedef void *cudaStream_t;
typedef void *(*MallocFuncType)(size_t, int, cudaStream_t);
typedef void (*FreeFuncType)(void *, size_t, int, cudaStream_t);
typedef void (*InitFnType)(int);
typedef void (*ResetFnType)(void);
typedef void (*MemoryFractionFnType)(double, int);
typedef void *(*BaseAllocFnType)(void *, size_t *);
typedef void (*RecordStreamFnType)(void *, cudaStream_t);
/* (int device, MempoolId_t id, std::function<bool(cudaStream_t)> filter):
 * the pair arrives as two integers, the std::function as a pointer. */
typedef void (*BeginAllocateToPoolFnType)(int, uint64_t, uint64_t, const void *);
typedef void (*EndAllocateToPoolFnType)(int, uint64_t, uint64_t);
typedef void (*ReleasePoolFnType)(int, uint64_t, uint64_t);

static const MallocFuncType alloc_fn = cachealloc_alloc;
static const FreeFuncType free_fn = cachealloc_free;
static const InitFnType init_fn = cachealloc_init;
static const ResetFnType reset_fn = cachealloc_reset;
static const MemoryFractionFnType memory_fraction_fn = cachealloc_set_memory_fraction;
static const BaseAllocFnType base_alloc_fn = cachealloc_base_alloc;
static const RecordStreamFnType record_stream_fn = cachealloc_record_stream;
static const BeginAllocateToPoolFnType begin_fn = cachealloc_begin_allocate_to_pool;
static const EndAllocateToPoolFnType end_fn = cachealloc_end_allocate_to_pool;
static const ReleasePoolFnType release_fn = cachealloc_release_pool;

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

static int cuda_mode;
static cudaStream_t side_stream; /* the second stream of the sequence */



static void print_stat(const char *key, int64_t value, void *user) {
    (void)user;
    printf("stat %s %lld\n", key, (long long)value);
}

/* ---------------------------------------------------------- OOM observer */

typedef struct {
    int calls, device;
    size_t alloc_size, device_total, device_free;
} oom_seen;

static void on_oom(int device, size_t alloc_size, size_t device_total, size_t device_free,
                   void *user) {
    oom_seen *s = user;
    s->calls++;
    s->device = device;
    s->alloc_size = alloc_size;
    s->device_total = device_total;
    s->device_free = device_free;
}

static oom_seen ooms;

typedef struct {
    int calls, device;
    cachealloc_oom_cause cause;
} cause_seen;

static void on_oom_cause(int device, const cachealloc_oom_cause *cause, void *user) {
    cause_seen *s = user;
    s->calls++;
    s->device = device;
    s->cause = *cause;
}

static cause_seen causes;

/* ------------------------------------------------------- the stub driver */

static void *stub_symbol(const char *name) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(lib, "cannot open the stub libcuda.so.1: %s", dlerror());
    void *f = dlsym(lib, name);
    CHECK(f, "libcuda.so.1 is not the stub driver (no %s)", name);
    return f;
}

/* -------------------------------------------------------------- sequence */

/* The fixed sequence whose statistics are compared with the allocator's
 * own (capi/tests/capi.rs, `sequence`: keep the two the same). */
static void sequence(void) {
    void *nothing = alloc_fn(0, 0, NULL);
    CHECK(nothing == NULL && no_error(), "alloc of 0 bytes: NULL without an error");
    free_fn(NULL, 0, 0, NULL);
    CHECK(no_error(), "free of NULL is a no-op");

    void *small = alloc_fn(1000, 0, NULL);
    CHECK(small && no_error(), "alloc 1000");
    void *large = alloc_fn(30 * MIB, 0, NULL);
    CHECK(large && no_error(), "alloc 30 MiB");
    void *side = alloc_fn(1000, 0, side_stream);
    CHECK(side && side != small, "alloc 1000 on the side stream");
    record_stream_fn(small, side_stream);
    CHECK(no_error(), "record_stream");

    size_t seg = 0;
    void *base = base_alloc_fn((char *)large + 4096, &seg);
    CHECK(base == large && seg >= 30 * MIB, "base_alloc: %p (%zu bytes) for %p", base, seg, large);
    CHECK(cachealloc_record_annotation(0, "after the first allocations") == 0, "annotation");

    free_fn(small, 1000, 0, NULL);
    CHECK(no_error(), "free 1000");
    free_fn(large, 30 * MIB, 0, NULL);
    CHECK(no_error(), "free 30 MiB");
    void *again = alloc_fn(30 * MIB, 0, NULL);
    CHECK(again == large, "the cached 30 MiB block is reused: %p, not %p", again, large);

    void *oom = alloc_fn(2 * GIB, 0, NULL);
    CHECK(oom == NULL, "2 GiB on a 1 GiB device fails");
    CHECK(error_has("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"),
          "PyTorch's out-of-memory message");
    CHECK(ooms.calls == 1 && ooms.device == 0 && ooms.alloc_size == 2 * GIB &&
              ooms.device_total == GIB && ooms.device_free <= GIB,
          "the OOM observer: %d calls, device %d, %zu, %zu, %zu", ooms.calls, ooms.device,
          ooms.alloc_size, ooms.device_total, ooms.device_free);
    CHECK(error_has("cachealloc: capacity: "), "the verdict after PyTorch's message");
    CHECK(causes.calls == 1 && causes.device == 0 && causes.cause.class_ == 0 &&
              strcmp(causes.cause.class_name, "capacity") == 0 &&
              causes.cause.needed == 2 * GIB && causes.cause.limit == GIB,
          "the cause observer: %d calls, class %d", causes.calls, causes.cause.class_);
    cachealloc_oom_cause last;
    CHECK(cachealloc_last_oom_cause(&last) == 0 && last.class_ == 0 && last.needed == 2 * GIB,
          "the thread's last out-of-memory cause");
    CHECK(cachealloc_last_oom_cause(NULL) == -1 && error_has("NULL"), "a NULL out is refused");
    cachealloc_fragmentation frag;
    CHECK(cachealloc_get_fragmentation(0, NULL, &frag) == 0 &&
              frag.large_pool.allocated_bytes == 30 * MIB &&
              frag.device.reserved_bytes >= 30 * MIB && frag.small_pool.allocated_bytes == 1024,
          "fragmentation: large %llu, small %llu",
          (unsigned long long)frag.large_pool.allocated_bytes,
          (unsigned long long)frag.small_pool.allocated_bytes);
    cachealloc_pool_memory large_pool;
    CHECK(cachealloc_get_pool_memory(0, 0, 0, 1, &large_pool) == 0 &&
              large_pool.allocated_bytes == frag.large_pool.allocated_bytes,
          "pool_memory of the default large pool");
    CHECK(cachealloc_get_pool_memory(0, 9, 9, 1, &large_pool) == -1, "an unknown pool");
    printf("ok out of memory: %s\n", last_error());

    free_fn(side, 1000, 0, side_stream);
    free_fn(again, 30 * MIB, 0, NULL);
    CHECK(no_error(), "frees");
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache");
}

/* --------------------------------------------------------------- threads */

#define THREADS 8
#define LIVE_PER_THREAD 4

typedef struct {
    uintptr_t lo, hi;
} interval;

/* The live allocations of all threads: an allocation is here from just
 * after its alloc returned to just before its free, so two that overlap
 * here overlapped in the allocator. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static interval live[THREADS * LIVE_PER_THREAD];
static int nlive;

static void live_insert(void *p, size_t size) {
    uintptr_t lo = (uintptr_t)p, hi = lo + size;
    pthread_mutex_lock(&live_lock);
    for (int i = 0; i < nlive; i++)
        if (lo < live[i].hi && live[i].lo < hi)
            FAIL("[%#lx, %#lx) overlaps the live [%#lx, %#lx)", (unsigned long)lo,
                 (unsigned long)hi, (unsigned long)live[i].lo, (unsigned long)live[i].hi);
    live[nlive].lo = lo;
    live[nlive].hi = hi;
    nlive++;
    pthread_mutex_unlock(&live_lock);
}

static void live_remove(void *p) {
    pthread_mutex_lock(&live_lock);
    for (int i = 0; i < nlive; i++)
        if (live[i].lo == (uintptr_t)p) {
            live[i] = live[--nlive];
            pthread_mutex_unlock(&live_lock);
            return;
        }
    FAIL("%p is not live", p);
}

typedef struct {
    int index;
    long iterations;
    long allocations; /* of more than 0 bytes */
} worker;

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void *work(void *arg) {
    worker *w = arg;
    uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(w->index + 1);
    cudaStream_t stream = cuda_mode ? NULL : (cudaStream_t)(uintptr_t)(0x1000 + 0x10 * w->index);
    void *ptr[LIVE_PER_THREAD] = {0};
    size_t size[LIVE_PER_THREAD] = {0};
    for (long i = 0; i < w->iterations; i++) {
        int k = (int)(xorshift(&rng) % LIVE_PER_THREAD);
        if (ptr[k]) {
            live_remove(ptr[k]);
            CHECK(cachealloc_free_checked(ptr[k], size[k], 0, stream) == 0, "free");
            ptr[k] = NULL;
        }
        uint64_t r = xorshift(&rng);
        size_t n = r % 64 == 0   ? 0
                   : r % 16 == 1 ? (size_t)(r >> 8) % (24 * MIB) + 1
                   : r % 4 == 2  ? (size_t)(r >> 8) % (4 * MIB) + 1
                                 : (size_t)(r >> 8) % MIB + 1;
        void *p = alloc_fn(n, 0, stream);
        if (n == 0) {
            CHECK(p == NULL && no_error(), "alloc of 0 bytes");
            continue;
        }
        CHECK(p != NULL, "alloc of %zu bytes in thread %d", n, w->index);
        w->allocations++;
        live_insert(p, n);
        ptr[k] = p;
        size[k] = n;
    }
    for (int k = 0; k < LIVE_PER_THREAD; k++)
        if (ptr[k]) {
            live_remove(ptr[k]);
            free_fn(ptr[k], size[k], 0, stream);
            CHECK(no_error(), "free");
        }
    return NULL;
}

static void threads(long iterations) {
    int64_t before = stat(0, "allocation.all.allocated");
    pthread_t t[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){i, iterations, 0};
        CHECK(pthread_create(&t[i], NULL, work, &w[i]) == 0, "pthread_create");
    }
    long total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        total += w[i].allocations;
    }
    CHECK(nlive == 0, "%d allocations left live", nlive);
    CHECK(stat(0, "allocation.all.allocated") - before == total,
          "allocations counted: %lld, made: %ld",
          (long long)(stat(0, "allocation.all.allocated") - before), total);
    CHECK(stat(0, "allocation.all.current") == 0 && stat(0, "allocated_bytes.all.current") == 0,
          "nothing allocated after the threads");
    printf("ok threads: %d x %ld alloc/free pairs, %ld allocations, no overlap\n", THREADS,
           iterations, total);
}

/* ------------------------------------------------------------------ main */


/* A pool's segment source (torch.cuda.MemPool(allocator=...)): host memory,
 * 512-byte aligned, with its calls counted. */
typedef struct {
    int allocs, frees, releases;
    size_t live;
    int refuse;
} source_counts;

static void *source_alloc(size_t size, int device, void *stream, void *user) {
    source_counts *c = user;
    (void)device;
    (void)stream;
    if (c->refuse) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 512, size) != 0) return NULL;
    c->allocs++;
    c->live += size;
    return p;
}

static void source_free(void *ptr, size_t size, int device, void *stream, void *user) {
    source_counts *c = user;
    (void)device;
    (void)stream;
    c->frees++;
    c->live -= size;
    free(ptr);
}

static void source_release(void *user) { ((source_counts *)user)->releases++; }

static void pool_with_a_source(void) {
    source_counts c = {0, 0, 0, 0, 0};
    cachealloc_segment_source src = {source_alloc, source_free, source_release, &c};
    CHECK(cachealloc_create_pool_with_source(0, 0, 77, 0, 0, &src) == 0 && no_error(),
          "create_pool_with_source: %s", last_error());
    CHECK(cachealloc_create_pool_with_source(0, 0, 77, 0, 0, &src) == -1 &&
              error_has("allocator of its own"),
          "a second one under the same id");
    cachealloc_segment_source no_free = {source_alloc, NULL, NULL, &c};
    CHECK(cachealloc_create_pool_with_source(0, 0, 78, 0, 0, &no_free) == -1 &&
              error_has("must not be NULL"),
          "a source without free");
    CHECK(cachealloc_create_pool_with_source(0, 0, 78, 0, 0, NULL) == -1, "a NULL source");
    CHECK(cachealloc_begin_allocate_to_pool_filtered(0, 0, 77, NULL, NULL) == 0, "route to it");
    void *a = cachealloc_alloc(1000, 0, NULL);
    void *b = cachealloc_alloc(5 * MIB, 0, NULL);
    c.refuse = 1;
    void *c_none = cachealloc_alloc(40 * MIB, 0, NULL);
    CHECK(c_none == NULL && cachealloc_last_error_code() == CACHEALLOC_ERROR_OUT_OF_MEMORY,
          "a source with no memory: an out-of-memory (%s)", last_error());
    c.refuse = 0;
    cachealloc_end_allocate_to_pool(0, 0, 77);
    CHECK(a && b && c.allocs == 2 && c.live == 2 * MIB + 20 * MIB,
          "two segments from the source (%d, %zu bytes)", c.allocs, c.live);
    CHECK(cachealloc_pool_use_count(0, 0, 77) == 2, "the routing's user");
    cachealloc_free(a, 1000, 0, NULL);
    cachealloc_free(b, 5 * MIB, 0, NULL);
    cachealloc_release_pool(0, 0, 77); /* use_mem_pool's exit */
    CHECK(cachealloc_empty_cache(0) == 0 && c.frees == 0, "kept while the pool has a user");
    cachealloc_release_pool(0, 0, 77); /* ~MemPool */
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache");
    CHECK(c.frees == 2 && c.live == 0 && c.releases == 1,
          "segments back to the source, then released (%d frees, %d releases)", c.frees,
          c.releases);
    CHECK(cachealloc_pool_use_count(0, 0, 77) == 0, "the pool is gone");
    printf("ok a pool with a segment source: %d allocs, %d frees, released once\n", c.allocs,
           c.frees);
}


/* torch's allocateWithAddress: a storage rebuilt at the address it had. */
static void alloc_at_address(void) {
    char *x = cachealloc_alloc(4 * MIB, 0, NULL);
    CHECK(x != NULL, "alloc");
    cachealloc_free(x, 4 * MIB, 0, NULL);
    void *y = cachealloc_alloc_at(3 * MIB, 0, NULL, x + 6 * MIB);
    CHECK(y == x + 6 * MIB && no_error(), "alloc_at in a free block's middle: %s", last_error());
    CHECK(cachealloc_alloc_at(MIB, 0, NULL, x + 7 * MIB) == NULL &&
              error_has("Could not allocate CUDA storage at exact address"),
          "alloc_at inside a live block: %s", last_error());
    CHECK(cachealloc_alloc_at(2 * MIB, 0, NULL, x + 100) == NULL &&
              error_has("must be aligned to kMinBlockSize (512 bytes)"),
          "alloc_at an unaligned address: %s", last_error());
    cachealloc_free(y, 3 * MIB, 0, NULL);
    printf("ok alloc_at: at the address asked for, PyTorch's errors otherwise\n");
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s mock|cuda ITERATIONS SNAPSHOT_DIR\n", argv[0]);
        return 2;
    }
    cuda_mode = strcmp(argv[1], "cuda") == 0;
    long iterations = atol(argv[2]);
    const char *dir = argv[3];
    side_stream = cuda_mode ? NULL : (cudaStream_t)(uintptr_t)0x10;

    if (cuda_mode) {
        void (*set_capacity)(uint64_t) = (void (*)(uint64_t))stub_symbol("cachealloc_stub_set_capacity");
        set_capacity(GIB);
    }

    const char *version = cachealloc_version();
    CHECK(version && version[0], "version");
    init_fn(0);
    init_fn(1);
    init_fn(1);
    CHECK(no_error(), "init(0), init(1) twice");
    CHECK(cachealloc_attach_oom_observer(on_oom, &ooms) == 0, "attach_oom_observer");
    CHECK(cachealloc_attach_oom_observer(NULL, NULL) == -1 && error_has("NULL"),
          "a NULL observer is refused");
    CHECK(cachealloc_attach_oom_cause_observer(on_oom_cause, &causes) == 0,
          "attach_oom_cause_observer");
    /* Before any device exists: applies to the devices created later. */
    CHECK(cachealloc_record_history(-1, 1, 0) == 0, "record_history(-1)");
    printf("ok cachealloc %s\n", version);

    sequence();
    CHECK(cachealloc_memory_stats(0, print_stat, NULL) == 0, "memory_stats");
    size_t cached = 1, largest = 1;
    CHECK(cachealloc_cache_info(0, &cached, &largest) == 0 && cached == 0 && largest == 0,
          "nothing cached after empty_cache: %zu, %zu", cached, largest);
    printf("ok sequence\n");

    /* Statistics calls. */
    CHECK(cachealloc_memory_stats(0, NULL, NULL) == -1 && error_has("NULL"), "NULL callback");
    CHECK(cachealloc_memory_stats(64, print_stat, NULL) == -1 && error_has("device 64"),
          "device 64 is out of range");
    CHECK(stat(0, "num_ooms") == 1, "one OOM");
    CHECK(cachealloc_reset_accumulated_stats(0) == 0 && stat(0, "num_ooms") == 0,
          "reset_accumulated_stats");
    void *p = alloc_fn(5 * MIB, 0, NULL);
    free_fn(p, 5 * MIB, 0, NULL);
    CHECK(stat(0, "allocated_bytes.all.peak") > 0, "a peak");
    CHECK(cachealloc_reset_peak_stats(0) == 0 && stat(0, "allocated_bytes.all.peak") == 0,
          "reset_peak_stats");
    printf("ok statistics\n");

    /* Memory fraction. */
    memory_fraction_fn(0.25, 0);
    CHECK(no_error(), "set_memory_fraction(0.25)");
    p = alloc_fn(300 * MIB, 0, NULL);
    CHECK(p == NULL && error_has("out of memory") && error_has("allowed"),
          "300 MiB above a quarter of 1 GiB");
    CHECK(ooms.calls == 2 && ooms.device_total == GIB / 4, "the observer sees the limit");
    memory_fraction_fn(2.0, 0);
    CHECK(cachealloc_last_error() != NULL, "a fraction of 2 is refused");
    memory_fraction_fn(1.0, 0);
    p = alloc_fn(300 * MIB, 0, NULL);
    CHECK(p != NULL, "300 MiB under the whole device");
    free_fn(p, 300 * MIB, 0, NULL);
    printf("ok memory fraction\n");

    /* Private pools (CUDA graphs): requests go to pool (1, 0) while routed. */
    begin_fn(0, 1, 0, NULL);
    CHECK(no_error(), "begin_allocate_to_pool");
    begin_fn(0, 1, 0, NULL);
    CHECK(error_has("already recording"), "a second begin on the same pool");
    void *in_pool = alloc_fn(1000, 0, NULL);
    end_fn(0, 1, 0);
    CHECK(in_pool && no_error(), "end_allocate_to_pool");
    end_fn(0, 1, 0);
    CHECK(error_has("not currently recording"), "a second end");
    void *outside = alloc_fn(1000, 0, NULL);
    CHECK(outside && no_error(), "alloc after the pool");
    printf("ok pools\n");

    /* Snapshots, with the pool's block and the default pool's live. */
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot.json", dir);
    CHECK(cachealloc_snapshot(-1, path) == 0, "snapshot %s", path);
    snprintf(path, sizeof path, "%s/snapshot.pickle", dir);
    CHECK(cachealloc_snapshot(0, path) == 0, "snapshot %s", path);
    CHECK(cachealloc_snapshot(0, "/nonexistent-dir/x.pickle") == -1 &&
              error_has("/nonexistent-dir/x.pickle"),
          "a snapshot that cannot be written");
    CHECK(cachealloc_snapshot(0, NULL) == -1, "a NULL path");
    free_fn(in_pool, 1000, 0, NULL);
    free_fn(outside, 1000, 0, NULL);
    release_fn(0, 1, 0);
    CHECK(no_error(), "release_pool");
    reset_fn();
    CHECK(no_error(), "reset");
    printf("ok snapshots\n");

    /* Bad frees: an error text, no crash, nothing changed. */
    int64_t allocated = stat(0, "allocation.all.current");
    free_fn((void *)(uintptr_t)0xdead0000, 16, 0, NULL);
    CHECK(error_has("0xdead0000"), "a free of a pointer not allocated here");
    CHECK(cachealloc_free_checked((void *)(uintptr_t)0xdead0000, 16, 0, NULL) == -1,
          "free_checked says so too");
    p = alloc_fn(4096, 0, NULL);
    free_fn(p, 4096, 0, NULL);
    CHECK(no_error(), "free");
    CHECK(cachealloc_free_checked(p, 4096, 0, NULL) == -1 && cachealloc_last_error(),
          "a double free");
    printf("ok double free: %s\n", last_error());
    CHECK(cachealloc_free_checked(p, 4096, 5, NULL) == -1 && error_has("device 5"),
          "a free on a device never used");
    record_stream_fn((void *)(uintptr_t)0xdead0000, NULL);
    CHECK(error_has("not allocated by cachealloc"), "record_stream of a pointer not ours");
    size_t seg = 7;
    CHECK(base_alloc_fn((void *)(uintptr_t)0xdead0000, &seg) == NULL && seg == 7,
          "base_alloc of a pointer not ours");
    CHECK(stat(0, "allocation.all.current") == allocated, "nothing changed");
    printf("ok bad frees\n");

    /* Aligned allocations (TensorFlow's AllocateRaw(alignment, n)). */
    void *al[4];
    size_t alignments[4] = {64, 4096, 65536, 2 * MIB};
    for (int k = 0; k < 4; k++) {
        al[k] = cachealloc_alloc_aligned(1000 + 4096 * (size_t)k, alignments[k], 0, NULL);
        CHECK(al[k] && ((uintptr_t)al[k] % alignments[k]) == 0 && no_error(),
              "alloc_aligned(%zu) = %p", alignments[k], al[k]);
    }
    CHECK(cachealloc_alloc_aligned(1000, 3000, 0, NULL) == NULL &&
              error_has("not a power of two"),
          "alignment 3000");
    CHECK(cachealloc_alloc_aligned(0, 4096, 0, NULL) == NULL && no_error(), "0 bytes");
    for (int k = 0; k < 4; k++) free_fn(al[k], 0, 0, NULL);
    CHECK(no_error() && stat(0, "allocation.all.current") == allocated, "aligned frees");
    printf("ok aligned allocations\n");

#ifdef CACHEALLOC_DEBUG_HOOKS
    /* A forced internal error (a panic inside the library) comes back as
     * NULL or -1 with a message, and the library goes on working. */
    CHECK(cachealloc_debug_force_internal_error() == 0, "arm");
    p = alloc_fn(1000, 0, NULL);
    CHECK(p == NULL && error_has("internal error in cachealloc_alloc"), "alloc: NULL");
    printf("ok internal error: %s\n", last_error());
    cachealloc_debug_force_internal_error();
    stat_query q = {"allocation.all.current", 0, 0};
    CHECK(cachealloc_memory_stats(0, find_stat, &q) == -1 &&
              error_has("internal error in cachealloc_memory_stats"),
          "memory_stats: -1");
    p = alloc_fn(1000, 0, NULL);
    CHECK(p && no_error(), "alloc after the internal errors");
    free_fn(p, 1000, 0, NULL);
    printf("ok internal errors\n");
#else
    printf("skipped internal errors: the library has no test hooks (feature debug-hooks)\n");
#endif

    pool_with_a_source();
    alloc_at_address();
    threads(iterations);
    CHECK(cachealloc_empty_cache(-1) == 0, "empty_cache(-1)");

    if (cuda_mode) {
        stub_counters c;
        void (*counters)(stub_counters *) =
            (void (*)(stub_counters *))stub_symbol("cachealloc_stub_counters");
        counters(&c);
        CHECK(c.live_allocations == 0 && c.bad_handles == 0 && c.live_events == 0,
              "the stub driver holds %llu allocations, %llu events, saw %llu bad handles",
              (unsigned long long)c.live_allocations, (unsigned long long)c.live_events,
              (unsigned long long)c.bad_handles);
        printf("ok stub driver: nothing held, no bad handle, %llu driver calls\n",
               (unsigned long long)c.calls);
    }
    printf("abi_test: all checks passed\n");
    return 0;
}

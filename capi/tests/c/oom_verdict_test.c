/*
 * The out-of-memory verdict through the C library, on a simulated device
 * of 64 MiB (CACHEALLOC_BACKEND=mock, CACHEALLOC_MOCK_CAPACITY=64MiB).
 * Built and run by capi/tests/capi.rs:
 *
 *   oom_verdict_test
 *
 * For each stream that holds the small blocks (the request's, 0, on
 * device 0; another, 1, on device 1): fill the device with 512 KiB blocks,
 * free every other one (each 2 MiB small segment stays split), then ask
 * for 20 MiB on stream 0. Small-pool blocks never serve that request on
 * any stream: both verdicts are the same class, `other_size`, with the 32
 * MiB counted as other-size bytes and nowhere else. Then a request of
 * 2^60 bytes fails as an out-of-memory with no verdict of its own, and
 * must not report the 20 MiB one; and an out-of-memory observer that runs
 * out of memory itself gets its own verdict there and leaves the failing
 * call's in place (each found by its error's number). Prints
 * `ok WHAT` per check, exits 1 at the first failure.
 */
#include "cachealloc.h"
#include "check.h"

#include <stdint.h>
#include <stdio.h>

#define MIB ((size_t)1 << 20)
#define BLOCKS 128 /* 64 MiB of 512 KiB blocks */

static cachealloc_oom_cause verdict(int device, void *holder) {
    void *p[BLOCKS];
    for (int k = 0; k < BLOCKS; k++) {
        p[k] = cachealloc_alloc(MIB / 2, device, holder);
        CHECK(p[k] != NULL, "block %d of 512 KiB on device %d", k, device);
    }
    for (int k = 1; k < BLOCKS; k += 2) cachealloc_free(p[k], MIB / 2, device, holder);
    CHECK(cachealloc_alloc(20 * MIB, device, NULL) == NULL, "20 MiB cannot fit");
    CHECK(cachealloc_last_error_code() == CACHEALLOC_ERROR_OUT_OF_MEMORY, "an out-of-memory");
    CHECK(error_has("CUDA out of memory. Tried to allocate 20.00 MiB"), "PyTorch's message");
    CHECK(error_has("cachealloc: other_size: 32.00 MiB is cached in blocks of the other size"),
          "the verdict and its bytes follow PyTorch's message");
    cachealloc_oom_cause c;
    CHECK(cachealloc_last_oom_cause(&c) == 0, "the thread has a verdict");
    CHECK(c.other_size_bytes == 32 * MIB, "32 MiB of small blocks (got %llu)",
          (unsigned long long)c.other_size_bytes);
    CHECK(c.free_bytes == 0 && c.pending_free_bytes == 0 && c.other_streams_bytes == 0 &&
              c.private_pools_bytes == 0,
          "counted as other-size bytes only");
    return c;
}

/* An out-of-memory observer that runs out of memory itself (once). */
static int depth;
static void allocating_observer(int device, size_t alloc_size, size_t total, size_t free_,
                                void *user) {
    (void)alloc_size, (void)total, (void)free_, (void)user;
    if (depth++ == 0) {
        CHECK(cachealloc_alloc((size_t)40 << 20, device, NULL) == NULL, "the nested request fails");
        cachealloc_oom_cause inner;
        CHECK(cachealloc_last_oom_cause(&inner) == 0 && inner.needed == 40 * MIB,
              "the nested request's own verdict, inside the outer one's delivery (needed %llu)",
              (unsigned long long)inner.needed);
    }
    depth--;
}

int main(void) {
    cachealloc_oom_cause same = verdict(0, NULL);
    cachealloc_oom_cause other = verdict(1, (void *)0x1);
    printf("ok small blocks on the request's stream: %s (class %d)\n", same.class_name,
           same.class_);
    printf("ok small blocks on another stream: %s (class %d)\n", other.class_name, other.class_);
    CHECK(same.class_ == other.class_, "the same class whichever stream holds the blocks");
    CHECK(strcmp(same.class_name, "other_size") == 0 && same.class_ == 8, "other_size (8)");

    CHECK(cachealloc_alloc((size_t)1 << 60, 0, NULL) == NULL, "2^60 bytes cannot fit");
    CHECK(cachealloc_last_error_code() == CACHEALLOC_ERROR_OUT_OF_MEMORY,
          "too large is an out-of-memory");
    CHECK(error_has("more than 1EB"), "PyTorch's message for too large");
    cachealloc_oom_cause after;
    int rc = cachealloc_last_oom_cause(&after);
    CHECK(rc == 1, "no verdict for a request refused before the allocator (got %d, needed %llu)",
          rc, rc == 0 ? (unsigned long long)after.needed : 0ULL);
    printf("ok a 2^60-byte request reports no verdict, not the 20 MiB one\n");

    /* An observer that runs out of memory itself leaves the failing call's
     * verdict in place, in the thread's last cause and in its message. */
    CHECK(cachealloc_attach_oom_observer(allocating_observer, NULL) == 0, "attach");
    void *big = cachealloc_alloc(50 * MIB, 2, NULL);
    CHECK(big != NULL, "50 MiB on device 2");
    CHECK(cachealloc_alloc(30 * MIB, 2, NULL) == NULL, "30 MiB more cannot fit");
    CHECK(error_has("Tried to allocate 30.00 MiB") && error_has("cachealloc: capacity:"),
          "the outer message, with its verdict");
    cachealloc_oom_cause outer;
    CHECK(cachealloc_last_oom_cause(&outer) == 0 && outer.needed == 30 * MIB,
          "the outer request's verdict (needed %llu)", (unsigned long long)outer.needed);
    cachealloc_free(big, 0, 2, NULL);
    printf("ok an observer that runs out of memory itself leaves the failing call's verdict\n");
    printf("oom_verdict_test: all checks passed\n");
    return 0;
}

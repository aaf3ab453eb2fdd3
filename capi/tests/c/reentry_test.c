/*
 * Callbacks that call back into the library while their device's lock is
 * held, on the simulated device. Built and run by capi/tests/capi.rs:
 *
 *   reentry_test
 *
 * A trace tracker, a pool's segment source (its alloc and free) and a
 * stream filter each call cachealloc_alloc from inside: the inner call
 * fails at once ("called from a callback while device N is locked")
 * instead of waiting for the lock for ever, the outer call returns with
 * its own result, and the device stays usable. An alarm turns a hang into
 * a failure. Prints `ok WHAT` per check, exits 1 at the first failure.
 */
#include "cachealloc.h"
#include "check.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

/* What a callback saw when it called in. */
struct seen {
    int calls;
    int got_null;
    char error[512];
};

static void call_in(struct seen *s) {
    s->calls++;
    void *p = cachealloc_alloc(4096, 0, NULL);
    if (p == NULL) {
        s->got_null++;
        const char *e = cachealloc_last_error();
        snprintf(s->error, sizeof s->error, "%s", e ? e : "(none)");
    } else {
        cachealloc_free(p, 4096, 0, NULL); /* not reached: the call fails */
    }
}

static int tracking;
static void tracker(const cachealloc_trace_entry *e, void *user) {
    (void)e;
    if (tracking) call_in(user);
}

static void *source_alloc(size_t size, int device, void *stream, void *user) {
    (void)device;
    (void)stream;
    call_in(user);
    return aligned_alloc(512, size);
}

static void source_free(void *ptr, size_t size, int device, void *stream, void *user) {
    (void)size;
    (void)device;
    (void)stream;
    call_in(user);
    free(ptr);
}

static int filter(void *stream, void *user) {
    (void)stream;
    call_in(user);
    return 0; /* nothing goes to the pool */
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL reentry_test: no answer in 20 s (a callback's call waited for the lock)\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(1);
}

static void check_refused(const struct seen *s, int device, const char *what) {
    char want[64];
    snprintf(want, sizeof want, "called from a callback while device %d is locked", device);
    CHECK(s->calls > 0, "the %s ran", what);
    CHECK(s->got_null == s->calls, "every call from the %s failed (%d of %d)", what, s->got_null,
          s->calls);
    CHECK(strstr(s->error, "cachealloc_alloc") && strstr(s->error, want),
          "the %s's error names the call and the rule: %s", what, s->error);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(20);
    cachealloc_init(1);

    /* A trace tracker. */
    struct seen t = {0};
    CHECK(cachealloc_attach_trace_tracker(tracker, &t) == 0, "attach the tracker");
    tracking = 1;
    void *p = cachealloc_alloc(MIB, 0, NULL);
    tracking = 0;
    CHECK(p != NULL, "the outer allocation succeeds");
    CHECK(no_error(), "the outer call reports no error (the refusal was the tracker's)");
    check_refused(&t, 0, "trace tracker");
    cachealloc_free(p, MIB, 0, NULL);
    printf("ok trace tracker: its call fails, the outer allocation succeeds\n");

    /* A pool's segment source: alloc when the pool grows, free at empty_cache. */
    struct seen s = {0};
    cachealloc_segment_source src = {source_alloc, source_free, NULL, &s};
    CHECK(cachealloc_create_pool_with_source(0, 7, 1, 0, 0, &src) == 0, "a pool with a source");
    cachealloc_begin_allocate_to_pool(0, 7, 1, NULL);
    p = cachealloc_alloc(MIB, 0, NULL);
    cachealloc_end_allocate_to_pool(0, 7, 1);
    CHECK(p != NULL, "the pool's allocation succeeds");
    check_refused(&s, 0, "segment source's alloc");
    cachealloc_free(p, MIB, 0, NULL);
    int before = s.calls;
    cachealloc_release_pool(0, 7, 1); /* the routing's user */
    cachealloc_release_pool(0, 7, 1); /* the creator's */
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache returns: %s", last_error());
    CHECK(s.calls > before, "the source's free ran");
    check_refused(&s, 0, "segment source's free");
    printf("ok segment source: its calls fail, the pool's allocation and release succeed\n");

    /* A stream filter, on device 1. */
    struct seen f = {0};
    CHECK(cachealloc_begin_allocate_to_pool_filtered(1, 8, 1, filter, &f) == 0, "routing");
    p = cachealloc_alloc(MIB, 1, NULL);
    cachealloc_end_allocate_to_pool(1, 8, 1);
    CHECK(p != NULL, "the filtered allocation succeeds");
    check_refused(&f, 1, "stream filter");
    cachealloc_free(p, MIB, 1, NULL);
    cachealloc_release_pool(1, 8, 1);
    printf("ok stream filter: its call fails, the allocation succeeds\n");

    /* Both devices work on, with nothing left allocated. */
    for (int d = 0; d < 2; d++) {
        p = cachealloc_alloc(MIB, d, NULL);
        CHECK(p != NULL, "device %d allocates", d);
        cachealloc_free(p, MIB, d, NULL);
        CHECK(cachealloc_empty_cache(d) == 0, "device %d empties", d);
        size_t cached = 1, largest = 1;
        CHECK(cachealloc_cache_info(d, &cached, &largest) == 0 && cached == 0, "device %d holds nothing",
              d);
    }
    printf("ok both devices usable, nothing left\n");
    printf("reentry_test: all checks passed\n");
    return 0;
}

/*
 * The first call on a device from a thread with a small stack (64 KiB, as
 * runtimes give their pool threads; musl's default is 128 KiB), on the
 * simulated device. Built and run by capi/tests/capi.rs:
 *
 *   small_stack_test
 *
 * Opening a device builds its allocator (some 230 KiB, moved by value),
 * which the library does on a thread of its own with room for it: the
 * caller's small stack does not overflow (the process would die of it).
 * Prints `ok WHAT` per check, exits 1 at the first failure.
 */
#include "cachealloc.h"
#include "check.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>

#define STACK ((size_t)64 << 10)

static void *open_and_use(void *arg) {
    int device = *(int *)arg;
    void *p = cachealloc_alloc(1 << 20, device, NULL);
    CHECK(p != NULL, "device %d opened from a small stack", device);
    cachealloc_free(p, 1 << 20, device, NULL);
    CHECK(no_error(), "freed");
    return NULL;
}

int main(void) {
    size_t stack = STACK < PTHREAD_STACK_MIN ? PTHREAD_STACK_MIN : STACK;
    pthread_attr_t attr;
    CHECK(pthread_attr_init(&attr) == 0 && pthread_attr_setstacksize(&attr, stack) == 0,
          "a %zu-byte stack", stack);
    int devices[2] = {0, 1};
    for (int k = 0; k < 2; k++) {
        pthread_t t;
        CHECK(pthread_create(&t, &attr, open_and_use, &devices[k]) == 0, "a thread");
        CHECK(pthread_join(t, NULL) == 0, "joined");
    }
    printf("ok two devices opened from threads of %zu KiB of stack\n", stack >> 10);
    printf("small_stack_test: all checks passed\n");
    return 0;
}

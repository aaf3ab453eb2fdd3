/*
 * What the C tests of libcachealloc share (abi_test.c, ipc_test.c,
 * graph_test.c): checks that stop at the first failure with the library's
 * last error, a statistic by key, and the project's stub driver's counters
 * (tests/stubs/stub_core.h, field for field).
 */
#ifndef CACHEALLOC_TEST_CHECK_H
#define CACHEALLOC_TEST_CHECK_H

#include "cachealloc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The last error, or "(none)". */
static inline const char *last_error(void) {
    const char *e = cachealloc_last_error();
    return e ? e : "(none)";
}

/* Whether the last call succeeded. */
static inline int no_error(void) { return cachealloc_last_error() == NULL; }

/* Whether the last error contains `text`. */
static inline int error_has(const char *text) {
    const char *e = cachealloc_last_error();
    return e && strstr(e, text);
}

#define FAIL(...)                                                                  \
    do {                                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
        fprintf(stderr, __VA_ARGS__);                                              \
        fprintf(stderr, " (last error: %s)\n", last_error());                      \
        exit(1);                                                                   \
    } while (0)
#define CHECK(cond, ...)                                                           \
    do {                                                                           \
        if (!(cond)) FAIL(__VA_ARGS__);                                            \
    } while (0)

/* One statistic of `device` (memory_stats through a callback). */
typedef struct {
    const char *key;
    int64_t value;
    int found;
} stat_query;

static inline void find_stat(const char *key, int64_t value, void *user) {
    stat_query *q = user;
    if (strcmp(key, q->key) == 0) {
        q->value = value;
        q->found = 1;
    }
}

static inline int64_t stat(int device, const char *key) {
    stat_query q = {key, 0, 0};
    CHECK(cachealloc_memory_stats(device, find_stat, &q) == 0, "memory_stats(%d)", device);
    CHECK(q.found, "no statistic %s", key);
    return q.value;
}

/* The stub driver's counters. */
typedef struct {
    uint64_t live_allocations, live_bytes, live_events, live_streams, retained_contexts,
        bad_handles, calls, injected, live_reservations, live_physical, live_mappings,
        live_imports, live_captures, capture_violations, live_graphs;
} stub_counters;

#endif

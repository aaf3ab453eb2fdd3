/*
 * The C functions the C++ allocator for torch is built on, on the simulated
 * device (CACHEALLOC_MOCK_CAPACITY=1GiB,
 * CACHEALLOC_CONF=max_split_size_mb:64,roundup_power2_divisions:4):
 * the statistics as one struct equal the keyed ones, an out-of-memory is
 * told apart from other failures, a snapshot walk agrees with the
 * statistics, a stream filter routes only its streams to a pool, a trace
 * tracker sees every entry, and the settings come back.
 */
#include "check.h"

/* ---------------------------------------------------------- statistics */

static const char *ARRAYS[] = {"allocation",      "segment",        "active",
                               "inactive_split",  "allocated_bytes", "reserved_bytes",
                               "active_bytes",    "inactive_split_bytes", "requested_bytes"};
static const char *POOLS[] = {"all", "small_pool", "large_pool"};

static int64_t field(const cachealloc_stat *s, const char *name) {
    if (!strcmp(name, "current")) return s->current;
    if (!strcmp(name, "peak")) return s->peak;
    if (!strcmp(name, "allocated")) return s->allocated;
    if (!strcmp(name, "freed")) return s->freed;
    FAIL("unknown field %s", name);
}

/* The struct's value of a memory_stats key (as torch flattens DeviceStats). */
static int64_t by_key(const cachealloc_device_stats *d, const char *key) {
    const cachealloc_stat *arrays[] = {d->allocation,      d->segment,        d->active,
                                       d->inactive_split,  d->allocated_bytes, d->reserved_bytes,
                                       d->active_bytes,    d->inactive_split_bytes,
                                       d->requested_bytes};
    char name[64], pool[32], f[32];
    if (sscanf(key, "%63[^.].%31[^.].%31s", name, pool, f) == 3) {
        for (size_t a = 0; a < 9; a++)
            for (size_t p = 0; p < 3; p++)
                if (!strcmp(name, ARRAYS[a]) && !strcmp(pool, POOLS[p]))
                    return field(&arrays[a][p], f);
    }
    if (sscanf(key, "%63[^.].%31s", name, f) == 2) {
        if (!strcmp(name, "oversize_allocations")) return field(&d->oversize_allocations, f);
        if (!strcmp(name, "oversize_segments")) return field(&d->oversize_segments, f);
    }
    if (!strcmp(key, "num_alloc_retries")) return d->num_alloc_retries;
    if (!strcmp(key, "num_ooms")) return d->num_ooms;
    if (!strcmp(key, "num_oom_rejections")) return d->num_oom_rejections;
    if (!strcmp(key, "num_sync_all_streams")) return d->num_sync_all_streams;
    if (!strcmp(key, "num_device_alloc")) return d->num_device_alloc;
    if (!strcmp(key, "num_device_free")) return d->num_device_free;
    if (!strcmp(key, "max_split_size")) return d->max_split_size;
    FAIL("no field for key %s", key);
}

typedef struct {
    cachealloc_device_stats s;
    int keys;
} compare_ctx;

static void compare_key(const char *key, int64_t value, void *user) {
    compare_ctx *c = user;
    CHECK(by_key(&c->s, key) == value, "%s: struct %lld, key %lld", key,
          (long long)by_key(&c->s, key), (long long)value);
    c->keys++;
}

static void stats_struct_equals_keys(void) {
    compare_ctx c;
    memset(&c, 0, sizeof c);
    CHECK(cachealloc_get_device_stats(0, &c.s) == 0, "get_device_stats");
    CHECK(cachealloc_memory_stats(0, compare_key, &c) == 0, "memory_stats");
    /* torch 2.12 on: num_oom_rejections (no private pool here) */
    CHECK(c.keys == 9 * 3 * 4 + 2 * 4 + 7, "keys: %d", c.keys);
    CHECK(cachealloc_get_device_stats(0, NULL) == -1 && error_has("NULL"), "NULL out");
    CHECK(cachealloc_last_error_code() == CACHEALLOC_ERROR_OTHER, "code of a bad call");
    printf("ok the statistics struct equals memory_stats key for key (%d keys)\n", c.keys);
}

/* ----------------------------------------------------------------- walk */

typedef struct {
    int segments, blocks, allocated_blocks, expected_blocks, no_blocks;
    size_t total, allocated, block_bytes;
    int traces, allocs, annotations, snapshots, pool_segments;
    uint64_t pool0;
} walk_ctx;

static void on_segment(const cachealloc_segment_info *s, void *user) {
    walk_ctx *w = user;
    CHECK(w->no_blocks || w->expected_blocks == 0, "blocks of the previous segment missing");
    w->segments++;
    w->total += s->total_size;
    w->allocated += s->allocated_size;
    w->expected_blocks = (int)s->num_blocks;
    if (s->pool_id0 == w->pool0 && w->pool0) w->pool_segments++;
}

static void on_block(const cachealloc_block_info *b, void *user) {
    walk_ctx *w = user;
    w->blocks++;
    w->expected_blocks--;
    w->block_bytes += b->size;
    if (b->allocated) {
        CHECK(b->active, "an allocated block is active");
        w->allocated_blocks++;
    }
}

static void on_trace(const cachealloc_trace_entry *e, void *user) {
    walk_ctx *w = user;
    w->traces++;
    if (e->action == 0) w->allocs++;
    if (e->action == 7) w->snapshots++;
    if (e->action == 9) {
        CHECK(e->annotation && !strcmp(e->annotation, "step 1"), "annotation name");
        w->annotations++;
    }
}

static void walk_agrees_with_stats(void) {
    CHECK(cachealloc_record_history(0, 1, 0) == 0, "record_history");
    void *p[6];
    for (int i = 0; i < 6; i++) {
        p[i] = cachealloc_alloc((size_t)(i + 1) << 19, 0, NULL);
        CHECK(p[i], "alloc %d", i);
    }
    CHECK(cachealloc_record_annotation(0, "step 1") == 0, "annotation");
    cachealloc_free(p[1], 0, 0, NULL);
    cachealloc_free(p[4], 0, 0, NULL);
    cachealloc_snapshot_visitor v = {on_segment, on_block, on_trace};
    walk_ctx w;
    memset(&w, 0, sizeof w);
    CHECK(cachealloc_snapshot_walk(0, 1, &v, &w) == 0, "walk");
    CHECK(w.expected_blocks == 0, "every block given");
    CHECK((int64_t)w.total == stat(0, "reserved_bytes.all.current"), "reserved %zu", w.total);
    CHECK(w.block_bytes == w.total, "blocks tile the segments");
    CHECK((int64_t)w.allocated == stat(0, "allocated_bytes.all.current"), "allocated");
    CHECK(w.allocated_blocks == stat(0, "allocation.all.current"), "allocations");
    CHECK(w.segments == stat(0, "segment.all.current"), "segments");
    CHECK(w.allocs == 6 && w.annotations == 1 && w.snapshots == 1, "traces: %d allocs, %d "
          "annotations, %d snapshots", w.allocs, w.annotations, w.snapshots);
    /* Without traces; and NULL callbacks are skipped. */
    walk_ctx w2;
    memset(&w2, 0, sizeof w2);
    w2.no_blocks = 1;
    cachealloc_snapshot_visitor segments_only = {on_segment, NULL, on_trace};
    CHECK(cachealloc_snapshot_walk(0, 0, &segments_only, &w2) == 0, "walk without traces");
    CHECK(w2.segments == w.segments && w2.traces == 0, "segments only");
    CHECK(cachealloc_snapshot_walk(0, 1, NULL, NULL) == -1 && error_has("visitor is NULL"),
          "NULL visitor");
    for (int i = 0; i < 6; i++)
        if (i != 1 && i != 4) cachealloc_free(p[i], 0, 0, NULL);
    CHECK(cachealloc_record_history(0, 0, 0) == 0, "history off");
    printf("ok a snapshot walk gives %d segments, %d blocks and %d trace entries that agree "
           "with the statistics\n", w.segments, w.blocks, w.traces);
}

/* ------------------------------------------------------- out of memory */

static void oom_is_told_apart(void) {
    CHECK(cachealloc_alloc((size_t)2 << 30, 0, NULL) == NULL, "2 GiB on a 1 GiB device");
    CHECK(cachealloc_last_error_code() == CACHEALLOC_ERROR_OUT_OF_MEMORY, "OOM code %d",
          cachealloc_last_error_code());
    CHECK(error_has("CUDA out of memory. Tried to allocate 2.00 GiB"), "PyTorch's message");
    CHECK(cachealloc_free_checked((void *)0x1234, 0, 0, NULL) == -1, "bad free");
    CHECK(cachealloc_last_error_code() == CACHEALLOC_ERROR_OTHER, "a bad free is not an OOM");
    void *p = cachealloc_alloc(1024, 0, NULL);
    CHECK(p && cachealloc_last_error_code() == CACHEALLOC_OK, "success clears the code");
    cachealloc_free(p, 0, 0, NULL);
    printf("ok an out-of-memory has its own error code and PyTorch's message\n");
}

/* -------------------------------------------------------- stream filter */

static int filter_calls;

static int only_stream_7(void *stream, void *user) {
    filter_calls++;
    return stream == user;
}

static void filter_routes_its_streams(void) {
    void *seven = (void *)7;
    CHECK(cachealloc_begin_allocate_to_pool_filtered(0, 42, 0, only_stream_7, seven) == 0,
          "begin filtered");
    void *in_pool = cachealloc_alloc(4 << 20, 0, seven);
    void *outside = cachealloc_alloc(4 << 20, 0, (void *)3);
    CHECK(in_pool && outside, "allocations");
    CHECK(filter_calls >= 2, "the filter was asked (%d)", filter_calls);
    cachealloc_snapshot_visitor v = {on_segment, on_block, NULL};
    walk_ctx w;
    memset(&w, 0, sizeof w);
    w.pool0 = 42;
    CHECK(cachealloc_snapshot_walk(0, 0, &v, &w) == 0, "walk");
    CHECK(w.pool_segments == 1, "one segment in pool 42: %d", w.pool_segments);
    cachealloc_end_allocate_to_pool(0, 42, 0);
    CHECK(no_error(), "end");
    cachealloc_free(in_pool, 0, 0, NULL);
    cachealloc_free(outside, 0, 0, NULL);
    cachealloc_release_pool(0, 42, 0);
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache");
    /* The same (filter, user) again: no new record, the same routing. */
    CHECK(cachealloc_begin_allocate_to_pool_filtered(0, 43, 0, only_stream_7, seven) == 0,
          "begin again");
    cachealloc_end_allocate_to_pool(0, 43, 0);
    cachealloc_release_pool(0, 43, 0);
    CHECK(cachealloc_begin_allocate_to_pool_filtered(0, 44, 0, NULL, NULL) == 0, "no filter");
    cachealloc_end_allocate_to_pool(0, 44, 0);
    cachealloc_release_pool(0, 44, 0);
    printf("ok a stream filter routes only its streams to the pool (%d calls)\n", filter_calls);
}

/* --------------------------------------------------------- trace tracker */

static int tracked[10];

static void tracker(const cachealloc_trace_entry *e, void *user) {
    CHECK(user == (void *)tracked, "user pointer");
    if (e->action >= 0 && e->action < 10) tracked[e->action]++;
}

static void tracker_sees_every_entry(void) {
    CHECK(cachealloc_attach_trace_tracker(NULL, NULL) == -1, "NULL tracker");
    CHECK(cachealloc_attach_trace_tracker(tracker, tracked) == 0, "attach");
    void *p = cachealloc_alloc(100 << 20, 0, NULL);
    CHECK(p, "alloc");
    cachealloc_free(p, 0, 0, NULL);
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache");
    CHECK(tracked[0] == 1 && tracked[1] == 1 && tracked[2] == 1 && tracked[3] == 1 &&
              tracked[4] == 1,
          "alloc %d free_requested %d free_completed %d segment_alloc %d segment_free %d",
          tracked[0], tracked[1], tracked[2], tracked[3], tracked[4]);
    /* A device created after the attach has it too. */
    void *q = cachealloc_alloc(1024, 1, NULL);
    CHECK(q && tracked[0] == 2, "device 1 tracked");
    cachealloc_free(q, 0, 1, NULL);
    printf("ok a trace tracker sees every entry, on devices created later too\n");
}

/* -------------------------------------------------------------- settings */

static void settings_come_back(void) {
    cachealloc_allocator_settings s;
    CHECK(cachealloc_get_allocator_settings(&s) == 0, "settings");
    CHECK(s.max_split_size == (size_t)64 << 20, "max_split_size %zu", s.max_split_size);
    CHECK(s.roundup_power2_divisions[0] == 4, "divisions");
    CHECK(!s.expandable_segments, "expandable");
    CHECK(!strcmp(s.last_allocator_settings, "max_split_size_mb:64,roundup_power2_divisions:4"),
          "text %s", s.last_allocator_settings);
    CHECK(cachealloc_get_allocator_settings(NULL) == -1, "NULL");
    printf("ok the allocator settings come back\n");
}

/* ------------------------------------------------------- checkpoints */

typedef struct {
    int freed, made;
    void *made_ptr[8];
} restore_ctx;

static void on_restored(void *ptr, size_t size, int allocated, void *user) {
    restore_ctx *r = user;
    (void)size;
    if (allocated) {
        if (r->made < 8) r->made_ptr[r->made] = ptr;
        r->made++;
    } else {
        r->freed++;
    }
}

static void checkpoints_rewind_a_pool(void) {
    CHECK(cachealloc_begin_allocate_to_pool_filtered(0, 70, 0, NULL, NULL) == 0, "begin");
    void *a = cachealloc_alloc(1 << 20, 0, NULL), *b = cachealloc_alloc(1 << 20, 0, NULL);
    cachealloc_end_allocate_to_pool(0, 70, 0);
    int64_t n = cachealloc_checkpoint_pool(0, 70, 0, NULL, 0);
    CHECK(n >= 2, "blocks: %lld", (long long)n);
    cachealloc_checkpoint_block blocks[16];
    CHECK(n <= 16 && cachealloc_checkpoint_pool(0, 70, 0, blocks, 16) == n, "checkpoint");
    CHECK(blocks[0].segment_start && blocks[0].allocated && blocks[0].ptr == (uint64_t)(uintptr_t)a,
          "the first block");
    cachealloc_free(a, 0, 0, NULL);
    cachealloc_free(b, 0, 0, NULL);
    restore_ctx r = {0, 0, {0}};
    CHECK(cachealloc_restore_pool(0, 70, 0, blocks, (size_t)n, on_restored, &r) == 0, "restore");
    CHECK(r.freed == 0 && r.made == 2, "freed %d made %d", r.freed, r.made);
    CHECK(stat(0, "allocation.all.current") >= 2, "allocated again");
    for (int i = 0; i < r.made; i++) cachealloc_free(r.made_ptr[i], 0, 0, NULL);
    CHECK(cachealloc_checkpoint_pool(0, 71, 0, NULL, 0) == -1, "no such pool");
    CHECK(cachealloc_restore_pool(0, 70, 0, blocks + 1, (size_t)n - 1, NULL, NULL) == -1 &&
              error_has("first block"),
          "a checkpoint that does not start a segment is refused");
    cachealloc_release_pool(0, 70, 0);
    CHECK(cachealloc_empty_cache_pool(0, 70, 0) == 0, "gone");
    printf("ok a checkpoint rewinds a pool (%lld blocks, %d handed back)\n", (long long)n, r.made);
}

/* --------------------------------------------------------- the others */

static void the_rest(void) {
    size_t free_b = 0, total = 0;
    CHECK(cachealloc_mem_get_info(0, &free_b, &total) == 0, "mem_get_info");
    CHECK(total == (size_t)1 << 30 && free_b <= total, "total %zu free %zu", total, free_b);
    /* free with device -1: the owner. */
    void *p = cachealloc_alloc(3 << 20, 1, NULL);
    CHECK(p, "alloc on device 1");
    int64_t before = stat(1, "allocation.all.current");
    CHECK(cachealloc_free_checked(p, 0, -1, NULL) == 0, "free by owner");
    CHECK(stat(1, "allocation.all.current") == before - 1, "freed on device 1");
    CHECK(cachealloc_free_checked(p, 0, -1, NULL) == -1, "a second free by owner is refused");
    /* empty_cache of one pool releases that pool's segments only. */
    CHECK(cachealloc_begin_allocate_to_pool_filtered(0, 50, 0, NULL, NULL) == 0, "begin 50");
    void *q = cachealloc_alloc(6 << 20, 0, NULL);
    cachealloc_end_allocate_to_pool(0, 50, 0);
    void *r = cachealloc_alloc(6 << 20, 0, NULL);
    cachealloc_free(q, 0, 0, NULL);
    cachealloc_free(r, 0, 0, NULL);
    int64_t segments = stat(0, "segment.all.current");
    cachealloc_release_pool(0, 50, 0);
    CHECK(cachealloc_empty_cache_pool(0, 50, 0) == 0, "empty_cache_pool");
    CHECK(stat(0, "segment.all.current") == segments - 1, "one segment released: %lld of %lld",
          (long long)stat(0, "segment.all.current"), (long long)segments);
    /* recordHistory's skip and clear. */
    CHECK(cachealloc_record_history_ex(0, 1, 0, 1, 1u << 7) == 0, "history, skip snapshots");
    void *s = cachealloc_alloc(512, 0, NULL);
    cachealloc_free(s, 0, 0, NULL);
    cachealloc_snapshot_visitor v = {NULL, NULL, on_trace};
    walk_ctx w;
    memset(&w, 0, sizeof w);
    CHECK(cachealloc_snapshot_walk(0, 1, &v, &w) == 0, "walk");
    CHECK(w.allocs == 1 && w.snapshots == 0, "cleared, snapshots skipped: %d allocs %d snaps",
          w.allocs, w.snapshots);
    CHECK(cachealloc_record_history_ex(0, 0, 0, 0, 0) == 0, "history off");
    /* torch.cuda.MemPool's pools. */
    CHECK(cachealloc_create_pool(0, 0, 0, 0, 0) == -1, "the default id is no private pool");
    CHECK(cachealloc_create_pool(0, 60, 0, 1, 1) == 0, "create");
    CHECK(cachealloc_pool_use_count(0, 60, 0) == 1, "one user");
    CHECK(cachealloc_set_pool_use_on_oom(0, 60, 0, 0) == 0 && cachealloc_set_pool_no_split(0, 60, 0) == 0,
          "options");
    CHECK(cachealloc_set_pool_no_split(0, 61, 0) == -1, "no such pool");
    cachealloc_release_pool(0, 60, 0);
    CHECK(cachealloc_pool_use_count(0, 60, 0) == 0, "released");
    CHECK(cachealloc_pool_use_count(99, 60, 0) == -1, "bad device");
    CHECK(cachealloc_empty_cache_pool(0, 60, 0) == 0, "deleted");
    printf("ok mem_get_info, a free by owner, empty_cache of one pool, history skip and clear, MemPool's pools\n");
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "pluggable-oom")) {
        /* torch's pluggable path: a failure aborts, never a NULL. */
        void *p = cachealloc_pluggable_alloc(1024, 0, NULL);
        CHECK(p, "a small allocation succeeds");
        cachealloc_free(p, 0, 0, NULL);
        CHECK(cachealloc_pluggable_alloc(0, 0, NULL) == NULL && no_error(), "0 bytes: NULL");
        printf("before the out-of-memory\n");
        fflush(stdout);
        cachealloc_pluggable_alloc((size_t)2 << 30, 0, NULL);
        printf("not reached\n");
        return 0;
    }
    stats_struct_equals_keys();
    walk_agrees_with_stats();
    oom_is_told_apart();
    stats_struct_equals_keys();
    filter_routes_its_streams();
    tracker_sees_every_entry();
    settings_come_back();
    the_rest();
    checkpoints_rewind_a_pool();
    printf("native_test: all checks passed\n");
    return 0;
}

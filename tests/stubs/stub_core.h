/*
 * The state machine shared by the stub drivers (cuda_stub.c, hip_stub.c):
 * a host-only stand-in for a GPU driver, so the backends' FFI is exercised
 * through the real libraries' entry points on machines without a GPU.
 *
 * - devices (default 1) with a capacity each; allocations at never-reused
 *   addresses (a bump pointer in 2 MiB steps), out of memory past the
 *   capacity;
 * - a current context / device per thread;
 * - streams and events: an event recorded on a stream stays pending until
 *   that stream, or its whole device, is synchronized, or the event itself;
 * - tombstones: a destroyed or freed handle stays known, so a second
 *   destroy or a later use gets the driver's error and is counted;
 * - virtual memory (expandable segments): address-space reservations (no
 *   capacity used), physical allocations of whole 2 MiB granules (counted
 *   against the capacity), mapped into a reservation at granule-aligned
 *   addresses, access set over mapped ranges only, unmapped, released; a
 *   physical allocation's memory returns once it is both released and
 *   unmapped; freeing a reservation with pages still mapped is an error;
 * - IPC (two processes): a handle names the exporting process, the
 *   allocation's address and size; while the exporter holds the allocation
 *   a marker file says so (in $CACHEALLOC_STUB_IPC_DIR, else /tmp), so
 *   another process can tell a live handle from a stale one. An open in
 *   another process maps the size at a fresh address of the caller's
 *   device (once per process: a second open is "already mapped"); the
 *   exporting process cannot open its own handle;
 * - peer access per pair of devices (each pair can, unless told it
 *   cannot), "already enabled" the second time; device-to-device copies
 *   checked against live allocations and opened handles;
 * - stream capture (CUDA graphs), with the drivers' rules
 *   (docs/capture-notes.md): a capture begins on a stream (never the
 *   legacy one) in a mode, and other streams join it by waiting for an
 *   event recorded in it; stream-ordered work on a capturing stream is
 *   captured, not run; while a capture is active, a "potentially unsafe"
 *   call (device malloc and free, memory info, event query and
 *   synchronization, stream synchronization, the virtual-memory calls)
 *   from a thread whose interaction mode prohibits it (the thread's own
 *   non-relaxed capture, or another thread's global one, unless the thread
 *   exchanged its mode for relaxed) fails with "capture unsupported" and
 *   invalidates the captures that prohibit it; some calls conflict with a
 *   capture in any mode (synchronizing a capturing stream or its device,
 *   querying an event recorded in a capture, using the legacy stream while
 *   a blocking stream captures, waiting across a capture's boundary);
 *   ending an invalidated capture fails with "capture invalidated" and
 *   gives no graph; graphs instantiate and launch;
 * - the graph a capture builds, as far as a reader of it sees: each piece
 *   of work captured on a stream (a memset, a copy, a graph launch) is a
 *   node that depends on the stream's terminal nodes (those its next work
 *   will follow) and becomes its only terminal node; an event recorded in
 *   a capture keeps the recording stream's terminal nodes, and a stream
 *   that waits for it adds them to its own (one that joins the capture by
 *   that wait starts with them); a capture's id, graph (made when it
 *   begins, handed out when it ends valid) and a stream's terminal nodes
 *   can be read, and a node's dependencies, until its graph is destroyed;
 * - fault injection by call name (or any call) and index;
 * - counters of what is still alive, read through `cachealloc_stub_counters`.
 *
 * Every entry point takes one lock. Handles are small integers in disjoint
 * ranges, cast to the drivers' pointer types.
 */
#ifndef CACHEALLOC_STUB_CORE_H
#define CACHEALLOC_STUB_CORE_H

/* Each stub defines this before including: 1 when a thread without a
 * current device uses device 0 (HIP), 0 when it has no context (CUDA). */
#ifndef STUB_IMPLICIT_DEVICE
#error "define STUB_IMPLICIT_DEVICE before including stub_core.h"
#endif

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define STUB_EXPORT __attribute__((visibility("default")))
#define STUB_MAX_DEVICES 8
#define STUB_SEGMENT_ALIGN (2ull << 20)
#define STUB_DEVICE_BASE 0x7f0000000000ull
#define STUB_DEVICE_SPAN (1ull << 40)
#define STUB_STREAM_BASE 0x10000000ull
#define STUB_EVENT_BASE 0x20000000ull
#define STUB_CONTEXT_BASE 0x30000000ull
#define STUB_PHYSICAL_BASE 0x40000000ull
#define STUB_GRAPH_BASE 0x50000000ull
#define STUB_NODE_BASE 0x60000000ull
#define STUB_GRANULARITY (2ull << 20)
#define STUB_HANDLE_STEP 0x10ull
/* The most dependencies a graph node has, and the most terminal nodes a
 * stream (or an event) keeps: a capture with more parallel branches than
 * this is beyond the stub, which then aborts. */
#define STUB_MAX_DEPS 16

/* What the tests read back. Field order is the Rust side's `StubCounters`. */
typedef struct {
    uint64_t live_allocations;
    uint64_t live_bytes;
    uint64_t live_events;
    uint64_t live_streams;
    uint64_t retained_contexts;
    uint64_t bad_handles;
    uint64_t calls;
    uint64_t injected;
    uint64_t live_reservations;
    uint64_t live_physical;
    uint64_t live_mappings;
    uint64_t live_imports;
    uint64_t live_captures;
    uint64_t capture_violations;
    uint64_t live_graphs;
} stub_counters;

typedef struct {
    uint64_t addr, size;
    int device, live, exported;
} stub_alloc;

/* Another process's allocation, opened here. */
typedef struct {
    uint64_t addr, size;
    uint64_t src_pid, src_addr;
    int device, live;
} stub_import;

/* Capture status (the drivers' CU_STREAM_CAPTURE_STATUS_* values) and
 * modes (CU_STREAM_CAPTURE_MODE_*). */
#define STUB_CAPTURE_NONE 0
#define STUB_CAPTURE_ACTIVE 1
#define STUB_CAPTURE_INVALIDATED 2
#define STUB_MODE_GLOBAL 0
#define STUB_MODE_THREAD_LOCAL 1
#define STUB_MODE_RELAXED 2

typedef struct {
    int device, live;
    uint64_t epoch;
    int blocking; /* created without the non-blocking flag */
    int capture;  /* STUB_CAPTURE_* */
    int capture_mode;
    pthread_t capture_thread; /* the thread that began the capture */
    uint64_t capture_id;      /* the capture sequence it is part of */
    int capture_origin;       /* it began the capture (others joined) */
    uint64_t capture_seq;     /* work queued on it in the capture */
    int unjoined;             /* joined the capture, not joined back since */
    long capture_graph;       /* the graph its capture builds */
    int nterminals;           /* its next captured work depends on these nodes */
    long terminals[STUB_MAX_DEPS];
    /* The terminal nodes' handles as the capture-info call last returned
     * them: on the heap, so that the array stays where it is when the
     * stream table grows, until the next such call on the stream. */
    void **terminal_out;
} stub_stream;

/* A graph (begun by a capture, or from an ended one) or an instantiated
 * one. */
typedef struct {
    int live, exec;
    int capturing; /* a capture builds it: it cannot be destroyed yet */
} stub_graph;

/* A node of a graph a capture built: work captured on a stream. It lives
 * as long as its graph. */
typedef struct {
    uint64_t capture_id;
    long graph;
    int ndeps;
    long deps[STUB_MAX_DEPS];
} stub_node;

typedef struct {
    uint64_t addr, size;
    int device, live;
} stub_reservation;

typedef struct {
    uint64_t size;
    int device, released, mapped;
    int handle_types;          /* requested at creation (1: POSIX file descriptor) */
    int imported;              /* made by an import: another process's memory */
    uint64_t src_pid, src_index; /* where it was created (this process's own: pid, index) */
} stub_physical;

typedef struct {
    uint64_t addr, size;
    long physical;
    int live, access;
} stub_mapping;

typedef struct {
    int live, recorded, done, device;
    long stream; /* index into streams, or -1 - device for a default stream */
    uint64_t stream_epoch, device_epoch;
    uint64_t capture_id; /* last recorded inside this capture (0: outside) */
    uint64_t capture_seq; /* the stream's capture_seq when recorded */
    int nterminals;       /* in a capture: the stream's terminal nodes then */
    long terminals[STUB_MAX_DEPS];
} stub_event;

typedef struct {
    char name[64]; /* empty: any call */
    uint64_t nth;  /* fires at this call count (of that name, or in all) */
    int code;
} stub_fault;

typedef struct {
    uint64_t capacity, held, next_addr;
    uint64_t default_epoch, device_epoch;
    uint64_t ctx_refs;
} stub_device;

typedef struct {
    char name[48];
    uint64_t count;
} stub_call_count;

static pthread_mutex_t stub_lock = PTHREAD_MUTEX_INITIALIZER;
static int stub_devices = 1;
static int stub_initialized;
static stub_device stub_dev[STUB_MAX_DEVICES];
static stub_alloc *stub_allocs;
static size_t stub_nallocs, stub_cap_allocs;
static stub_stream *stub_streams;
static size_t stub_nstreams, stub_cap_streams;
static stub_event *stub_events;
static size_t stub_nevents, stub_cap_events;
static stub_reservation *stub_reservations;
static size_t stub_nreservations, stub_cap_reservations;
static stub_physical *stub_physicals;
static size_t stub_nphysicals, stub_cap_physicals;
static stub_mapping *stub_mappings;
static size_t stub_nmappings, stub_cap_mappings;
static stub_import *stub_imports;
static size_t stub_nimports, stub_cap_imports;
static unsigned char stub_peer_enabled[STUB_MAX_DEVICES][STUB_MAX_DEVICES];
static unsigned char stub_peer_denied[STUB_MAX_DEVICES][STUB_MAX_DEVICES];
static stub_fault stub_faults[64];
static size_t stub_nfaults;
static stub_call_count stub_call_counts[64];
static size_t stub_ncall_counts;
static stub_graph *stub_graphs;
static size_t stub_ngraphs, stub_cap_graphs;
static stub_node *stub_nodes;
static size_t stub_nnodes, stub_cap_nodes;
static uint64_t stub_calls, stub_injected, stub_bad_handles;
static uint64_t stub_capture_ids, stub_capture_violations;
static __thread int stub_current = -1; /* this thread's device, -1: none */
/* This thread's capture interaction mode (cuThreadExchangeStreamCaptureMode). */
static __thread int stub_thread_mode = STUB_MODE_GLOBAL;

#define STUB_GROW(arr, n, cap)                                                 \
    do {                                                                       \
        if ((n) == (cap)) {                                                    \
            size_t c = (cap) ? (cap) * 2 : 64;                                 \
            void *p = realloc((arr), c * sizeof(*(arr)));                      \
            if (!p) abort();                                                   \
            (arr) = p;                                                         \
            (cap) = c;                                                         \
        }                                                                      \
    } while (0)

/* ------------------------------------------------------ IPC marker files */

/* The marker file saying that process `pid` still holds its exported
 * allocation at `addr`. */
static void stub_ipc_marker(char *out, size_t n, uint64_t pid, uint64_t addr) {
    const char *dir = getenv("CACHEALLOC_STUB_IPC_DIR");
    snprintf(out, n, "%s/cachealloc-stub-ipc-%llu-%llx", dir && dir[0] ? dir : "/tmp",
             (unsigned long long)pid, (unsigned long long)addr);
}

/* The allocation is no longer held: its handles go stale. */
static void stub_ipc_unexport(stub_alloc *a) {
    if (!a->exported) return;
    char path[512];
    stub_ipc_marker(path, sizeof path, (uint64_t)getpid(), a->addr);
    unlink(path);
    a->exported = 0;
}

/* A process that ends holds nothing: no marker may outlive it. */
__attribute__((destructor)) static void stub_ipc_unexport_all(void) {
    for (size_t i = 0; i < stub_nallocs; i++) stub_ipc_unexport(&stub_allocs[i]);
}

static void stub_reset_locked(int devices, uint64_t capacity) {
    for (size_t i = 0; i < stub_nallocs; i++) stub_ipc_unexport(&stub_allocs[i]);
    stub_devices = devices < 0 ? 0 : (devices > STUB_MAX_DEVICES ? STUB_MAX_DEVICES : devices);
    for (int d = 0; d < STUB_MAX_DEVICES; d++) {
        stub_dev[d].capacity = capacity;
        stub_dev[d].held = 0;
        stub_dev[d].next_addr = STUB_DEVICE_BASE + (uint64_t)d * STUB_DEVICE_SPAN;
        stub_dev[d].default_epoch = 0;
        stub_dev[d].device_epoch = 0;
        stub_dev[d].ctx_refs = 0;
    }
    stub_initialized = 0;
    for (size_t i = 0; i < stub_nstreams; i++) free(stub_streams[i].terminal_out);
    stub_nallocs = stub_nstreams = stub_nevents = 0;
    stub_nreservations = stub_nphysicals = stub_nmappings = 0;
    stub_nimports = 0;
    stub_ngraphs = 0;
    stub_nnodes = 0;
    stub_capture_violations = 0;
    memset(stub_peer_enabled, 0, sizeof(stub_peer_enabled));
    memset(stub_peer_denied, 0, sizeof(stub_peer_denied));
    stub_nfaults = 0;
    stub_ncall_counts = 0;
    stub_calls = stub_injected = stub_bad_handles = 0;
}

/* Settings from the environment at first use: CACHEALLOC_STUB_DEVICES
 * (default 1) and CACHEALLOC_STUB_CAPACITY (each device's bytes; default
 * unlimited). */
static void stub_init_once_locked(void) {
    static int done;
    if (done) return;
    done = 1;
    const char *d = getenv("CACHEALLOC_STUB_DEVICES");
    const char *c = getenv("CACHEALLOC_STUB_CAPACITY");
    stub_reset_locked(d ? atoi(d) : 1, c ? strtoull(c, NULL, 10) : UINT64_MAX);
}

static uint64_t stub_count_call_locked(const char *name) {
    for (size_t i = 0; i < stub_ncall_counts; i++)
        if (strcmp(stub_call_counts[i].name, name) == 0) return stub_call_counts[i].count++;
    if (stub_ncall_counts < 64) {
        strncpy(stub_call_counts[stub_ncall_counts].name, name, 47);
        stub_call_counts[stub_ncall_counts].count = 1;
        stub_ncall_counts++;
    }
    return 0;
}

/* Count a call of `name`; the injected error code if a fault fires, else 0. */
static int stub_enter_locked(const char *name) {
    stub_init_once_locked();
    uint64_t any = stub_calls++;
    uint64_t this_name = stub_count_call_locked(name);
    for (size_t i = 0; i < stub_nfaults; i++) {
        stub_fault *f = &stub_faults[i];
        int hit = f->name[0] ? (strcmp(f->name, name) == 0 && f->nth == this_name) : f->nth == any;
        if (hit) {
            int code = f->code;
            stub_faults[i] = stub_faults[--stub_nfaults];
            stub_injected++;
            return code;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- handles */

static void *stub_handle(uint64_t base, size_t index) {
    return (void *)(uintptr_t)(base + (index + 1) * STUB_HANDLE_STEP);
}

/* The index of a handle in [base, base + n), or -1. */
static long stub_index(const void *h, uint64_t base, size_t n) {
    uint64_t v = (uint64_t)(uintptr_t)h;
    if (v <= base || (v - base) % STUB_HANDLE_STEP) return -1;
    uint64_t i = (v - base) / STUB_HANDLE_STEP - 1;
    return i < n ? (long)i : -1;
}

/* A live stream of the handle, or -1 - device for the default (null)
 * stream of `device`; -2 - STUB_MAX_DEVICES when unknown or destroyed. */
#define STUB_BAD_STREAM (-2 - STUB_MAX_DEVICES)
static long stub_stream_of(const void *s, int device) {
    if (s == NULL) return -1 - device;
    long i = stub_index(s, STUB_STREAM_BASE, stub_nstreams);
    if (i < 0 || !stub_streams[i].live) {
        stub_bad_handles++;
        return STUB_BAD_STREAM;
    }
    return i;
}

static long stub_event_of(const void *e) {
    long i = stub_index(e, STUB_EVENT_BASE, stub_nevents);
    if (i < 0 || !stub_events[i].live) {
        stub_bad_handles++;
        return -1;
    }
    return i;
}

static uint64_t stub_stream_epoch(long s) {
    return s >= 0 ? stub_streams[s].epoch : stub_dev[-1 - s].default_epoch;
}

static int stub_event_ready(const stub_event *e) {
    if (!e->recorded || e->done) return 1;
    return stub_stream_epoch(e->stream) != e->stream_epoch ||
           stub_dev[e->device].device_epoch != e->device_epoch;
}

/* -------------------------------------------------------------- resources */

/* 0, or 1 (out of memory), or 2 (bad size); the address in *out. */
static int stub_alloc_locked(int device, uint64_t size, uint64_t *out) {
    stub_device *d = &stub_dev[device];
    if (size == 0) return 2;
    if (size > d->capacity - d->held) return 1;
    uint64_t span = (size + STUB_SEGMENT_ALIGN - 1) / STUB_SEGMENT_ALIGN * STUB_SEGMENT_ALIGN;
    STUB_GROW(stub_allocs, stub_nallocs, stub_cap_allocs);
    stub_allocs[stub_nallocs++] = (stub_alloc){d->next_addr, size, device, 1, 0};
    *out = d->next_addr;
    d->next_addr += span;
    d->held += size;
    return 0;
}

/* 0, or 1 when `addr` is not the base of a live allocation. */
static int stub_free_locked(uint64_t addr) {
    for (size_t i = 0; i < stub_nallocs; i++) {
        stub_alloc *a = &stub_allocs[i];
        if (a->addr == addr && a->live) {
            a->live = 0;
            stub_ipc_unexport(a);
            stub_dev[a->device].held -= a->size;
            return 0;
        }
    }
    stub_bad_handles++;
    return 1;
}

/* Whether [addr, addr + n) lies in a live allocation. */
static int stub_in_allocation(uint64_t addr, uint64_t n) {
    for (size_t i = 0; i < stub_nallocs; i++) {
        stub_alloc *a = &stub_allocs[i];
        if (a->live && addr >= a->addr && n <= a->size && addr - a->addr <= a->size - n) return 1;
    }
    return 0;
}

static void *stub_stream_create_locked(int device, int blocking) {
    STUB_GROW(stub_streams, stub_nstreams, stub_cap_streams);
    stub_stream st;
    memset(&st, 0, sizeof st);
    st.device = device;
    st.live = 1;
    st.blocking = blocking;
    stub_streams[stub_nstreams] = st;
    return stub_handle(STUB_STREAM_BASE, stub_nstreams++);
}

static void *stub_event_create_locked(int device) {
    STUB_GROW(stub_events, stub_nevents, stub_cap_events);
    stub_events[stub_nevents] = (stub_event){.live = 1, .device = device};
    return stub_handle(STUB_EVENT_BASE, stub_nevents++);
}

static void stub_event_record_locked(long e, long s, int device) {
    stub_event *ev = &stub_events[e];
    ev->recorded = 1;
    ev->done = 0;
    ev->device = device;
    ev->stream = s;
    ev->stream_epoch = stub_stream_epoch(s);
    ev->device_epoch = stub_dev[device].device_epoch;
    ev->capture_id = 0;
    ev->nterminals = 0;
}

static void stub_stream_sync_locked(long s) {
    if (s >= 0)
        stub_streams[s].epoch++;
    else
        stub_dev[-1 - s].default_epoch++;
}

/* --------------------------------------------------------- virtual memory */

/* The live reservation holding [addr, addr + n), or -1. */
static long stub_reservation_of(uint64_t addr, uint64_t n) {
    for (size_t i = 0; i < stub_nreservations; i++) {
        stub_reservation *r = &stub_reservations[i];
        if (r->live && addr >= r->addr && addr - r->addr + n <= r->size) return (long)i;
    }
    return -1;
}

/* The device of the reservation holding `addr` (0 if none). */
static int stub_addr_device(uint64_t addr) {
    long i = stub_reservation_of(addr, 1);
    return i < 0 ? 0 : stub_reservations[i].device;
}

/* Whether a live mapping overlaps [addr, addr + n). */
static int stub_mapped_overlap(uint64_t addr, uint64_t n) {
    for (size_t i = 0; i < stub_nmappings; i++) {
        stub_mapping *m = &stub_mappings[i];
        if (m->live && m->addr < addr + n && addr < m->addr + m->size) return 1;
    }
    return 0;
}

/* Whether live mappings cover [addr, addr + n) exactly, each lying wholly
 * inside it. */
static int stub_mapped_exactly(uint64_t addr, uint64_t n) {
    uint64_t covered = 0;
    for (size_t i = 0; i < stub_nmappings; i++) {
        stub_mapping *m = &stub_mappings[i];
        if (!m->live || m->addr + m->size <= addr || addr + n <= m->addr) continue;
        if (m->addr < addr || m->addr + m->size > addr + n) return 0;
        covered += m->size;
    }
    return covered == n;
}

/* A physical allocation's memory goes back once released and unmapped. */
static void stub_physical_settle(long p) {
    stub_physical *ph = &stub_physicals[p];
    if (ph->released && !ph->mapped && ph->size) {
        /* An import's memory is its exporter's: never counted here. */
        if (!ph->imported) stub_dev[ph->device].held -= ph->size;
        ph->size = 0;
    }
}

static long stub_physical_of(const void *h) {
    long i = stub_index(h, STUB_PHYSICAL_BASE, stub_nphysicals);
    if (i < 0 || stub_physicals[i].released) {
        stub_bad_handles++;
        return -1;
    }
    return i;
}

/* ------------------------------------------------------- entry points */

/* What an entry point found; each stub maps it to its driver's code. */
typedef enum {
    ST_OK,
    ST_INJECTED, /* a planted failure: the code is in stub_injected_code */
    ST_INVALID_VALUE,
    ST_OUT_OF_MEMORY,
    ST_NOT_INITIALIZED,
    ST_NO_DEVICE,
    ST_INVALID_DEVICE,
    ST_INVALID_CONTEXT,
    ST_BAD_HANDLE,
    ST_NOT_READY,
    ST_MAP_FAILED,
    ST_ALREADY_MAPPED,
    ST_PEER_UNSUPPORTED,
    ST_PEER_ALREADY_ENABLED,
    ST_ILLEGAL_STATE,         /* capture begun twice, ended without one */
    ST_CAPTURE_UNSUPPORTED,   /* prohibited while a stream captures */
    ST_CAPTURE_INVALIDATED,   /* the capture was invalidated */
    ST_CAPTURE_UNMATCHED,     /* ended on a stream that did not begin it */
    ST_CAPTURE_UNJOINED,      /* a forked stream not joined back at the end */
    ST_CAPTURE_ISOLATION,     /* a wait across the capture's boundary */
    ST_CAPTURE_IMPLICIT,      /* the legacy stream while a blocking stream captures */
    ST_CAPTURED_EVENT,        /* an event recorded in a capture queried */
    ST_CAPTURE_WRONG_THREAD,  /* a non-relaxed capture ended by another thread */
} stub_status;

static __thread int stub_injected_code;

/* ---------------------------------------------------------------- capture */

/* Whether stream `s` (a live one) is part of a capture, active or not. */
static int stub_in_capture(long s) {
    return s >= 0 && stub_streams[s].capture != STUB_CAPTURE_NONE;
}

/* Whether capturing stream `st` prohibits a potentially unsafe call by the
 * calling thread now: the thread's own non-relaxed capture does, unless it
 * exchanged its mode for relaxed; another thread's capture does when both
 * it and this thread are in global mode. */
static int stub_capture_prohibits(const stub_stream *st) {
    if (st->capture != STUB_CAPTURE_ACTIVE || st->capture_mode == STUB_MODE_RELAXED) return 0;
    if (stub_thread_mode == STUB_MODE_RELAXED) return 0;
    if (pthread_equal(st->capture_thread, pthread_self())) return 1;
    return stub_thread_mode == STUB_MODE_GLOBAL && st->capture_mode == STUB_MODE_GLOBAL;
}

/* Invalidate every stream of capture sequence `id`. */
static void stub_invalidate_capture(uint64_t id) {
    for (size_t i = 0; i < stub_nstreams; i++)
        if (stub_streams[i].capture != STUB_CAPTURE_NONE && stub_streams[i].capture_id == id)
            stub_streams[i].capture = STUB_CAPTURE_INVALIDATED;
}

/* Which captures a call on a device conflicts with. */
typedef enum {
    STUB_PROHIBITING, /* a potentially unsafe call: those whose mode prohibits it */
    STUB_ANY,         /* a device synchronization: every active one */
    STUB_BLOCKING,    /* legacy-stream work: those of blocking streams */
} stub_conflict;

/* A call on `device` that conflicts with its captures of kind `which`:
 * ST_OK if there is none, else `code`, with each of them invalidated.
 * (Captures on other devices are not affected.) */
static stub_status stub_conflicts_locked(int device, stub_conflict which, stub_status code) {
    int hit = 0;
    for (size_t i = 0; i < stub_nstreams; i++) {
        stub_stream *st = &stub_streams[i];
        if (!st->live || st->device != device || st->capture != STUB_CAPTURE_ACTIVE) continue;
        int conflicts = which == STUB_PROHIBITING ? stub_capture_prohibits(st)
                        : which == STUB_BLOCKING  ? st->blocking
                                                  : 1;
        if (conflicts) {
            stub_invalidate_capture(st->capture_id);
            hit = 1;
        }
    }
    if (!hit) return ST_OK;
    stub_capture_violations++;
    return code;
}

/* A potentially unsafe call on `device` (refused: "capture unsupported"). */
static stub_status stub_unsafe_locked(int device) {
    return stub_conflicts_locked(device, STUB_PROHIBITING, ST_CAPTURE_UNSUPPORTED);
}

/* A synchronization of `device`: conflicts with its captures in any mode. */
static stub_status stub_conflict_device_locked(int device) {
    return stub_conflicts_locked(device, STUB_ANY, ST_CAPTURE_UNSUPPORTED);
}

/* Work on the legacy default stream of `device`: it synchronizes with
 * every blocking stream, so a blocking stream's capture makes it an
 * implicit dependency on uncaptured work. */
static stub_status stub_legacy_locked(int device) {
    return stub_conflicts_locked(device, STUB_BLOCKING, ST_CAPTURE_IMPLICIT);
}

/* Stream-ordered work queued on stream `s` of `device`: the legacy
 * stream's rule; on a stream of an invalidated capture, the capture's
 * error; else ST_OK (captured if the stream captures). */
static stub_status stub_enqueue_locked(long s, int device) {
    if (s < 0) return stub_legacy_locked(device);
    stub_stream *st = &stub_streams[s];
    if (st->capture == STUB_CAPTURE_INVALIDATED) return ST_CAPTURE_INVALIDATED;
    if (st->capture == STUB_CAPTURE_ACTIVE) {
        st->capture_seq++;
        if (!st->capture_origin) st->unjoined = 1; /* a forked stream's work */
    }
    return ST_OK;
}

/* Add node `n` to the terminal set `set` of `*count` nodes. */
static void stub_terminal_add(long *set, int *count, long n) {
    for (int i = 0; i < *count; i++)
        if (set[i] == n) return;
    if (*count == STUB_MAX_DEPS) {
        fprintf(stderr, "stub driver: more than %d terminal nodes in a capture\n", STUB_MAX_DEPS);
        abort();
    }
    set[(*count)++] = n;
}

/* Work (not an event record or a wait) queued on stream `s` of `device`,
 * as `stub_enqueue_locked`; captured, it is a new node of the capture's
 * graph that depends on the stream's terminal nodes and becomes the only
 * one. */
static stub_status stub_work_locked(long s, int device) {
    stub_status r = stub_enqueue_locked(s, device);
    if (r != ST_OK || s < 0 || stub_streams[s].capture != STUB_CAPTURE_ACTIVE) return r;
    stub_stream *st = &stub_streams[s];
    STUB_GROW(stub_nodes, stub_nnodes, stub_cap_nodes);
    stub_node *n = &stub_nodes[stub_nnodes];
    n->capture_id = st->capture_id;
    n->graph = st->capture_graph;
    n->ndeps = st->nterminals;
    memcpy(n->deps, st->terminals, sizeof n->deps);
    st->terminals[0] = (long)stub_nnodes++;
    st->nterminals = 1;
    return ST_OK;
}

/* Take the lock and count the call; ST_INJECTED (lock released) if a
 * planted failure fires. */
static stub_status stub_begin(const char *name) {
    pthread_mutex_lock(&stub_lock);
    int code = stub_enter_locked(name);
    if (code) {
        stub_injected_code = code;
        pthread_mutex_unlock(&stub_lock);
        return ST_INJECTED;
    }
    return ST_OK;
}

static stub_status stub_end(stub_status s) {
    pthread_mutex_unlock(&stub_lock);
    return s;
}

#define STUB_BEGIN(name)                                                       \
    do {                                                                       \
        if (stub_begin(name) == ST_INJECTED) return ST_INJECTED;               \
    } while (0)

/* Whether the driver takes calls at all (CUDA: after cuInit). */
static stub_status stub_ready_locked(void) {
#if STUB_IMPLICIT_DEVICE
    return ST_OK;
#else
    return stub_initialized ? ST_OK : ST_NOT_INITIALIZED;
#endif
}

/* The calling thread's device. HIP: device 0 until the thread sets one.
 * CUDA: the current context's device; none is an error. */
static stub_status stub_device_locked(int *dev) {
#if STUB_IMPLICIT_DEVICE
    if (stub_devices == 0) return ST_NO_DEVICE;
    *dev = stub_current < 0 ? 0 : stub_current;
    return ST_OK;
#else
    if (!stub_initialized) return ST_NOT_INITIALIZED;
    if (stub_current < 0 || stub_dev[stub_current].ctx_refs == 0) return ST_INVALID_CONTEXT;
    *dev = stub_current;
    return ST_OK;
#endif
}

#define STUB_DEVICE(dev)                                                       \
    int dev = 0;                                                               \
    do {                                                                       \
        stub_status s_ = stub_device_locked(&dev);                             \
        if (s_ != ST_OK) return stub_end(s_);                                  \
    } while (0)

/* A potentially unsafe call on device `dev`: return the capture's refusal. */
#define STUB_UNSAFE(dev)                                                       \
    do {                                                                       \
        stub_status c_ = stub_unsafe_locked(dev);                              \
        if (c_ != ST_OK) return stub_end(c_);                                  \
    } while (0)

/* Allocate `size` bytes; a zero size is an error unless `zero_is_null`. */
static stub_status stub_op_malloc(const char *name, uint64_t *out, uint64_t size, int zero_is_null) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    STUB_UNSAFE(dev);
    if (!out) return stub_end(ST_INVALID_VALUE);
    if (size == 0 && zero_is_null) {
        *out = 0;
        return stub_end(ST_OK);
    }
    switch (stub_alloc_locked(dev, size, out)) {
    case 0: return stub_end(ST_OK);
    case 1: return stub_end(ST_OUT_OF_MEMORY);
    default: return stub_end(ST_INVALID_VALUE);
    }
}

/* Free the allocation at `addr`; null is fine when `null_ok`. */
static stub_status stub_op_free(const char *name, uint64_t addr, int null_ok) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    STUB_UNSAFE(dev);
    if (addr == 0 && null_ok) return stub_end(ST_OK);
    return stub_end(stub_free_locked(addr) ? ST_INVALID_VALUE : ST_OK);
}

static stub_status stub_op_mem_info(const char *name, size_t *free_bytes, size_t *total) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    STUB_UNSAFE(dev);
    if (!free_bytes || !total) return stub_end(ST_INVALID_VALUE);
    *total = stub_dev[dev].capacity;
    *free_bytes = stub_dev[dev].capacity - stub_dev[dev].held;
    return stub_end(ST_OK);
}

static int stub_accessible(uint64_t addr, uint64_t n);

/* Set `n` bytes at `addr` (an allocation, an opened handle or mapped
 * pages) on `stream`. */
static stub_status stub_op_memset(const char *name, uint64_t addr, uint64_t n, void *stream) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (!stub_accessible(addr, n)) return stub_end(ST_INVALID_VALUE);
    long s = stub_stream_of(stream, dev);
    if (s == STUB_BAD_STREAM) return stub_end(ST_BAD_HANDLE);
    return stub_end(stub_work_locked(s, dev));
}

/* A stream; `flags` bit 0 is the drivers' non-blocking flag. */
static stub_status stub_op_stream_create(const char *name, void **stream, unsigned flags) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (!stream) return stub_end(ST_INVALID_VALUE);
    *stream = stub_stream_create_locked(dev, !(flags & 1));
    return stub_end(ST_OK);
}

static stub_status stub_op_stream_destroy(const char *name, void *stream) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    long s = stream ? stub_stream_of(stream, 0) : STUB_BAD_STREAM;
    if (s < 0) return stub_end(ST_BAD_HANDLE);
    if (stub_in_capture(s)) return stub_end(ST_ILLEGAL_STATE);
    stub_streams[s].live = 0;
    free(stub_streams[s].terminal_out);
    stub_streams[s].terminal_out = NULL;
    return stub_end(ST_OK);
}

static stub_status stub_op_stream_sync(const char *name, void *stream) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    long s = stub_stream_of(stream, dev);
    if (s == STUB_BAD_STREAM) return stub_end(ST_BAD_HANDLE);
    int sdev = s >= 0 ? stub_streams[s].device : dev;
    if (stub_in_capture(s)) {
        /* Waiting for a capturing stream conflicts with its capture. */
        stub_invalidate_capture(stub_streams[s].capture_id);
        stub_capture_violations++;
        return stub_end(ST_CAPTURE_UNSUPPORTED);
    }
    if (s < 0) {
        stub_status c = stub_legacy_locked(sdev);
        if (c != ST_OK) return stub_end(c);
    }
    STUB_UNSAFE(sdev);
    stub_stream_sync_locked(s);
    return stub_end(ST_OK);
}

static stub_status stub_op_device_sync(const char *name) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    stub_status c = stub_conflict_device_locked(dev);
    if (c != ST_OK) return stub_end(c);
    stub_dev[dev].device_epoch++;
    return stub_end(ST_OK);
}

static stub_status stub_op_event_create(const char *name, void **event) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (!event) return stub_end(ST_INVALID_VALUE);
    *event = stub_event_create_locked(dev);
    return stub_end(ST_OK);
}

/* Record `event` on `stream` (both of one device). */
static stub_status stub_op_event_record(const char *name, void *event, void *stream) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    long e = stub_event_of(event);
    long s = stub_stream_of(stream, dev);
    if (e < 0 || s == STUB_BAD_STREAM) return stub_end(ST_BAD_HANDLE);
    int sdev = s >= 0 ? stub_streams[s].device : dev;
    if (stub_events[e].device != sdev) return stub_end(ST_BAD_HANDLE);
    stub_status c = stub_enqueue_locked(s, sdev);
    if (c != ST_OK) return stub_end(c);
    stub_event_record_locked(e, s, sdev);
    if (stub_in_capture(s)) { /* a graph node */
        stub_event *ev = &stub_events[e];
        ev->capture_id = stub_streams[s].capture_id;
        ev->capture_seq = stub_streams[s].capture_seq;
        ev->nterminals = stub_streams[s].nterminals;
        memcpy(ev->terminals, stub_streams[s].terminals, sizeof ev->terminals);
    }
    return stub_end(ST_OK);
}

/* Make `stream` wait for `event` on the device: both must be live and of
 * one device. (The stub runs no work, so the wait changes nothing else.)
 * A stream that waits for an event recorded in a capture joins that
 * capture; a capturing stream may not wait for an event from outside its
 * capture (the dependency would cross its boundary). */
static stub_status stub_op_stream_wait(const char *name, void *stream, void *event) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    long e = stub_event_of(event);
    long s = stub_stream_of(stream, dev);
    if (e < 0 || s == STUB_BAD_STREAM) return stub_end(ST_BAD_HANDLE);
    int sdev = s >= 0 ? stub_streams[s].device : dev;
    if (stub_events[e].device != sdev) return stub_end(ST_BAD_HANDLE);
    stub_status c = stub_enqueue_locked(s, sdev);
    if (c != ST_OK) return stub_end(c);
    uint64_t id = stub_events[e].capture_id;
    long from = stub_events[e].stream;
    if (stub_in_capture(s)) {
        if (id != stub_streams[s].capture_id) {
            stub_invalidate_capture(stub_streams[s].capture_id);
            stub_capture_violations++;
            return stub_end(ST_CAPTURE_ISOLATION);
        }
        /* The origin waits for a forked stream's latest work: joined back. */
        if (stub_streams[s].capture_origin && from >= 0 && from != s &&
            stub_events[e].capture_seq == stub_streams[from].capture_seq)
            stub_streams[from].unjoined = 0;
        /* Its next work follows the event's nodes too. */
        for (int i = 0; i < stub_events[e].nterminals; i++)
            stub_terminal_add(stub_streams[s].terminals, &stub_streams[s].nterminals, stub_events[e].terminals[i]);
    } else if (id != 0 && s >= 0) {
        /* Join the capture of the stream the event was recorded on. */
        if (from >= 0 && stub_streams[from].capture_id == id && stub_in_capture(from)) {
            stub_stream *st = &stub_streams[s];
            st->capture = stub_streams[from].capture;
            st->capture_mode = stub_streams[from].capture_mode;
            st->capture_thread = stub_streams[from].capture_thread;
            st->capture_id = id;
            st->capture_origin = 0;
            st->capture_seq = 0;
            st->unjoined = 1;
            st->capture_graph = stub_streams[from].capture_graph;
            st->nterminals = stub_events[e].nterminals;
            memcpy(st->terminals, stub_events[e].terminals, sizeof st->terminals);
        }
    }
    return stub_end(ST_OK);
}

/* What an event-only entry point does with a live event. */
typedef enum { STUB_EVENT_QUERY, STUB_EVENT_SYNCHRONIZE, STUB_EVENT_DESTROY } stub_event_op;

static stub_status stub_op_event(const char *name, void *event, stub_event_op op) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    long e = stub_event_of(event);
    if (e < 0) return stub_end(ST_BAD_HANDLE);
    if (op != STUB_EVENT_DESTROY) {
        /* An event recorded in a capture is a graph node, not work. */
        if (stub_events[e].capture_id != 0) return stub_end(ST_CAPTURED_EVENT);
        STUB_UNSAFE(stub_events[e].device);
    }
    switch (op) {
    case STUB_EVENT_QUERY:
        return stub_end(stub_event_ready(&stub_events[e]) ? ST_OK : ST_NOT_READY);
    case STUB_EVENT_SYNCHRONIZE: stub_events[e].done = 1; break;
    case STUB_EVENT_DESTROY: stub_events[e].live = 0; break;
    }
    return stub_end(ST_OK);
}

/* The allocation granularity (2 MiB) of the device in `location`. */
static stub_status stub_op_granularity(const char *name, size_t *out, const void *prop, int device) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    if (!out || !prop) return stub_end(ST_INVALID_VALUE);
    if (device < 0 || device >= stub_devices) return stub_end(ST_INVALID_DEVICE);
    *out = STUB_GRANULARITY;
    return stub_end(ST_OK);
}

/* The device's total memory: its capacity (80 GiB when unlimited). */
static stub_status stub_op_total_mem(const char *name, size_t *out, int device) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    if (!out) return stub_end(ST_INVALID_VALUE);
    if (device < 0 || device >= stub_devices) return stub_end(ST_INVALID_DEVICE);
    uint64_t cap = stub_dev[device].capacity;
    *out = cap == UINT64_MAX ? (80ull << 30) : cap;
    return stub_end(ST_OK);
}

/* Reserve `size` bytes of address space (a whole number of granules). */
static stub_status stub_op_reserve(const char *name, uint64_t *out, uint64_t size) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    STUB_UNSAFE(dev);
    if (!out || size == 0 || size % STUB_GRANULARITY) return stub_end(ST_INVALID_VALUE);
    stub_device *d = &stub_dev[dev];
    if (size > STUB_DEVICE_SPAN || d->next_addr + size > STUB_DEVICE_BASE + (uint64_t)(dev + 1) * STUB_DEVICE_SPAN)
        return stub_end(ST_OUT_OF_MEMORY);
    STUB_GROW(stub_reservations, stub_nreservations, stub_cap_reservations);
    stub_reservations[stub_nreservations++] = (stub_reservation){d->next_addr, size, dev, 1};
    *out = d->next_addr;
    d->next_addr += size;
    return stub_end(ST_OK);
}

/* Free a whole reservation with nothing mapped in it. */
static stub_status stub_op_address_free(const char *name, uint64_t addr, uint64_t size) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    long i = stub_reservation_of(addr, size);
    if (i < 0 || stub_reservations[i].addr != addr || stub_reservations[i].size != size ||
        stub_mapped_overlap(addr, size)) {
        stub_bad_handles++;
        return stub_end(ST_INVALID_VALUE);
    }
    STUB_UNSAFE(stub_reservations[i].device);
    stub_reservations[i].live = 0;
    return stub_end(ST_OK);
}

/* New physical memory of `size` bytes on `device`, exportable as the
 * handle types `handle_types` asks for (0 or 1: a POSIX file descriptor;
 * the stub has no fabric). */
static stub_status stub_op_mem_create(const char *name, void **out, uint64_t size, int device,
                                      int handle_types) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    if (!out || size == 0 || size % STUB_GRANULARITY || (handle_types & ~1))
        return stub_end(ST_INVALID_VALUE);
    if (device < 0 || device >= stub_devices) return stub_end(ST_INVALID_DEVICE);
    STUB_UNSAFE(device);
    stub_device *d = &stub_dev[device];
    if (size > d->capacity - d->held) return stub_end(ST_OUT_OF_MEMORY);
    STUB_GROW(stub_physicals, stub_nphysicals, stub_cap_physicals);
    stub_physicals[stub_nphysicals] =
        (stub_physical){size, device, 0, 0, handle_types, 0, (uint64_t)getpid(), stub_nphysicals};
    d->held += size;
    *out = stub_handle(STUB_PHYSICAL_BASE, stub_nphysicals++);
    return stub_end(ST_OK);
}

static stub_status stub_op_mem_release(const char *name, void *handle) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    long p = stub_physical_of(handle);
    if (p < 0) return stub_end(ST_INVALID_VALUE);
    STUB_UNSAFE(stub_physicals[p].device);
    stub_physicals[p].released = 1;
    stub_physical_settle(p);
    return stub_end(ST_OK);
}

/* Map all of physical allocation `handle` at `addr` (inside a reservation,
 * granule-aligned, over nothing mapped). */
static stub_status stub_op_mem_map(const char *name, uint64_t addr, uint64_t size, uint64_t offset,
                                   void *handle) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    long p = stub_physical_of(handle);
    if (p < 0) return stub_end(ST_INVALID_VALUE);
    stub_physical *ph = &stub_physicals[p];
    if (offset != 0 || size != ph->size || ph->mapped || addr % STUB_GRANULARITY ||
        stub_reservation_of(addr, size) < 0 || stub_mapped_overlap(addr, size)) {
        stub_bad_handles++;
        return stub_end(ST_INVALID_VALUE);
    }
    STUB_UNSAFE(stub_addr_device(addr));
    STUB_GROW(stub_mappings, stub_nmappings, stub_cap_mappings);
    stub_mappings[stub_nmappings++] = (stub_mapping){addr, size, p, 1, 0};
    ph->mapped = 1;
    return stub_end(ST_OK);
}

/* Make [addr, addr + size), which mappings cover exactly, accessible. */
static stub_status stub_op_set_access(const char *name, uint64_t addr, uint64_t size, const void *desc,
                                      size_t count) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    if (!desc || count == 0 || !stub_mapped_exactly(addr, size)) {
        stub_bad_handles++;
        return stub_end(ST_INVALID_VALUE);
    }
    STUB_UNSAFE(stub_addr_device(addr));
    for (size_t i = 0; i < stub_nmappings; i++) {
        stub_mapping *m = &stub_mappings[i];
        if (m->live && m->addr >= addr && m->addr + m->size <= addr + size) m->access = 1;
    }
    return stub_end(ST_OK);
}

/* Unmap [addr, addr + size), which mappings cover exactly. */
static stub_status stub_op_mem_unmap(const char *name, uint64_t addr, uint64_t size) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    if (size == 0 || !stub_mapped_exactly(addr, size)) {
        stub_bad_handles++;
        return stub_end(ST_INVALID_VALUE);
    }
    STUB_UNSAFE(stub_addr_device(addr));
    for (size_t i = 0; i < stub_nmappings; i++) {
        stub_mapping *m = &stub_mappings[i];
        if (m->live && m->addr >= addr && m->addr + m->size <= addr + size) {
            m->live = 0;
            stub_physicals[m->physical].mapped = 0;
            stub_physical_settle(m->physical);
        }
    }
    return stub_end(ST_OK);
}

/* ------------------------------------- VMM handles across processes */

/* An exported physical allocation: a sealed memfd holding this record
 * (the driver's POSIX-fd shareable handle). The receiving process gets
 * the descriptor with pidfd_getfd and imports it. */
#define STUB_VMM_MAGIC "cachealloc-vmm"
typedef struct {
    char magic[16];
    uint64_t pid, index, size;
    int32_t device, handle_types;
} stub_vmm_record;

/* A new descriptor (the caller closes it) for physical allocation
 * `handle`, as handle type `type` (1: POSIX file descriptor). A type the
 * allocation was not created for, flags, or a released handle: invalid
 * value (the real driver's code for the type mismatch is not documented;
 * HIP's is invalid value). */
static stub_status stub_op_mem_export(const char *name, int *out, void *handle, int type,
                                      unsigned long long flags) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    long p = stub_physical_of(handle);
    if (p < 0 || !out || flags) return stub_end(ST_INVALID_VALUE);
    stub_physical *ph = &stub_physicals[p];
    if (type != 1 || !(ph->handle_types & 1)) return stub_end(ST_INVALID_VALUE);
    STUB_UNSAFE(ph->device);
    stub_vmm_record rec;
    memset(&rec, 0, sizeof rec);
    memcpy(rec.magic, STUB_VMM_MAGIC, sizeof STUB_VMM_MAGIC);
    rec.pid = ph->src_pid;
    rec.index = ph->src_index;
    rec.size = ph->size;
    rec.device = ph->device;
    rec.handle_types = ph->handle_types;
    int fd = memfd_create("cachealloc-stub-vmm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return stub_end(ST_OUT_OF_MEMORY);
    if (pwrite(fd, &rec, sizeof rec, 0) != (ssize_t)sizeof rec ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
        close(fd);
        return stub_end(ST_OUT_OF_MEMORY);
    }
    *out = fd;
    return stub_end(ST_OK);
}

/* A physical allocation of this process for the exported one behind file
 * descriptor `fd` (type 1). The memory stays its exporter's: it is not
 * counted against this device. Not a sealed stub record (a closed
 * descriptor, another file): invalid value. The descriptor stays the
 * caller's. */
static stub_status stub_op_mem_import(const char *name, void **out, int fd, int type) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    if (!out || type != 1) return stub_end(ST_INVALID_VALUE);
    stub_vmm_record rec;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_WRITE) || pread(fd, &rec, sizeof rec, 0) != (ssize_t)sizeof rec ||
        memcmp(rec.magic, STUB_VMM_MAGIC, sizeof STUB_VMM_MAGIC) != 0 || !(rec.handle_types & 1) ||
        rec.size == 0 || rec.size % STUB_GRANULARITY) {
        stub_bad_handles++;
        return stub_end(ST_INVALID_VALUE);
    }
    if (rec.device < 0 || rec.device >= stub_devices) return stub_end(ST_INVALID_DEVICE);
    STUB_UNSAFE(rec.device);
    STUB_GROW(stub_physicals, stub_nphysicals, stub_cap_physicals);
    stub_physicals[stub_nphysicals] =
        (stub_physical){rec.size, rec.device, 0, 0, rec.handle_types, 1, rec.pid, rec.index};
    *out = stub_handle(STUB_PHYSICAL_BASE, stub_nphysicals++);
    return stub_end(ST_OK);
}

/* -------------------------------------------------------------------- IPC */

#define STUB_IPC_MAGIC "cachealloc-stub" /* 16 bytes with its NUL */
#define STUB_IPC_HANDLE_SIZE 64

/* The handle (64 bytes at `out`) of the live allocation that starts at
 * `addr`: magic, exporting pid, address, size, device. */
static stub_status stub_op_ipc_get(const char *name, unsigned char *out, uint64_t addr) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    (void)dev;
    if (!out) return stub_end(ST_INVALID_VALUE);
    stub_alloc *a = NULL;
    for (size_t i = 0; i < stub_nallocs; i++)
        if (stub_allocs[i].live && stub_allocs[i].addr == addr) a = &stub_allocs[i];
    if (!a) {
        stub_bad_handles++;
        return stub_end(ST_INVALID_VALUE);
    }
    if (!a->exported) {
        char path[512];
        stub_ipc_marker(path, sizeof path, (uint64_t)getpid(), addr);
        FILE *f = fopen(path, "w");
        if (!f) return stub_end(ST_MAP_FAILED);
        fclose(f);
        a->exported = 1;
    }
    uint64_t words[3] = {(uint64_t)getpid(), addr, a->size};
    int32_t device = a->device;
    memset(out, 0, STUB_IPC_HANDLE_SIZE);
    memcpy(out, STUB_IPC_MAGIC, 16);
    memcpy(out + 16, words, sizeof words);
    memcpy(out + 40, &device, sizeof device);
    return stub_end(ST_OK);
}

/* Open another process's handle on the calling thread's device: a fresh
 * address for its size. Not a stub handle: bad handle; the exporter freed
 * it: map failed; opened here already: already mapped; our own: invalid
 * context (a process cannot open what it exported). */
static stub_status stub_op_ipc_open(const char *name, uint64_t *out, const unsigned char *h) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (!out || !h) return stub_end(ST_INVALID_VALUE);
    if (memcmp(h, STUB_IPC_MAGIC, 16) != 0) return stub_end(ST_BAD_HANDLE);
    uint64_t w[3];
    memcpy(w, h + 16, sizeof w);
    if (w[2] == 0 || w[2] > STUB_DEVICE_SPAN) return stub_end(ST_BAD_HANDLE);
    if (w[0] == (uint64_t)getpid()) return stub_end(ST_INVALID_CONTEXT);
    char path[512];
    stub_ipc_marker(path, sizeof path, w[0], w[1]);
    if (access(path, F_OK) != 0) return stub_end(ST_MAP_FAILED);
    for (size_t i = 0; i < stub_nimports; i++) {
        stub_import *m = &stub_imports[i];
        if (m->live && m->device == dev && m->src_pid == w[0] && m->src_addr == w[1])
            return stub_end(ST_ALREADY_MAPPED);
    }
    stub_device *d = &stub_dev[dev];
    uint64_t span = (w[2] + STUB_SEGMENT_ALIGN - 1) / STUB_SEGMENT_ALIGN * STUB_SEGMENT_ALIGN;
    STUB_GROW(stub_imports, stub_nimports, stub_cap_imports);
    stub_imports[stub_nimports++] = (stub_import){d->next_addr, w[2], w[0], w[1], dev, 1};
    *out = d->next_addr;
    d->next_addr += span;
    return stub_end(ST_OK);
}

/* Close what `stub_op_ipc_open` opened at `addr`. */
static stub_status stub_op_ipc_close(const char *name, uint64_t addr) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    (void)dev;
    for (size_t i = 0; i < stub_nimports; i++)
        if (stub_imports[i].live && stub_imports[i].addr == addr) {
            stub_imports[i].live = 0;
            return stub_end(ST_OK);
        }
    stub_bad_handles++;
    return stub_end(ST_INVALID_VALUE);
}

/* -------------------------------------------------- peer access, copies */

/* Let the calling thread's device access device `peer`. */
static stub_status stub_op_peer_enable(const char *name, int peer) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (peer < 0 || peer >= stub_devices || peer == dev) return stub_end(ST_INVALID_DEVICE);
    if (stub_peer_denied[dev][peer]) return stub_end(ST_PEER_UNSUPPORTED);
    if (stub_peer_enabled[dev][peer]) return stub_end(ST_PEER_ALREADY_ENABLED);
    stub_peer_enabled[dev][peer] = 1;
    return stub_end(ST_OK);
}

/* Whether [addr, addr + n) lies in a live allocation, an opened handle or
 * mapped pages (any device). */
static int stub_accessible(uint64_t addr, uint64_t n) {
    if (stub_in_allocation(addr, n)) return 1;
    for (size_t i = 0; i < stub_nimports; i++) {
        stub_import *m = &stub_imports[i];
        if (m->live && addr >= m->addr && n <= m->size && addr - m->addr <= m->size - n) return 1;
    }
    uint64_t covered = 0;
    for (size_t i = 0; i < stub_nmappings; i++) {
        stub_mapping *m = &stub_mappings[i];
        if (n > UINT64_MAX - addr) return 0;
        if (!m->live || m->addr + m->size <= addr || addr + n <= m->addr) continue;
        uint64_t lo = m->addr > addr ? m->addr : addr;
        uint64_t hi = m->addr + m->size < addr + n ? m->addr + m->size : addr + n;
        covered += hi - lo;
    }
    return n > 0 && covered == n;
}

/* Queue a copy of `n` bytes on `stream` of the calling thread's device;
 * for a peer copy (`dst_dev`, `src_dev` >= 0) both devices must exist. */
static stub_status stub_op_memcpy(const char *name, uint64_t dst, uint64_t src, uint64_t n, void *stream,
                                  int dst_dev, int src_dev) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (dst_dev >= stub_devices || src_dev >= stub_devices) return stub_end(ST_INVALID_DEVICE);
    if (n > 0 && (!stub_accessible(dst, n) || !stub_accessible(src, n))) return stub_end(ST_INVALID_VALUE);
    long s = stub_stream_of(stream, dev);
    if (s == STUB_BAD_STREAM) return stub_end(ST_BAD_HANDLE);
    return stub_end(stub_work_locked(s, dev));
}

/* ------------------------------------------------- stream capture, graphs */

/* A new graph (or, with `exec`, an instantiated one): its index. */
static long stub_graph_create_locked(int exec) {
    STUB_GROW(stub_graphs, stub_ngraphs, stub_cap_graphs);
    stub_graphs[stub_ngraphs] = (stub_graph){.live = 1, .exec = exec};
    return (long)stub_ngraphs++;
}

/* Begin capturing `stream` in `mode` (not the legacy stream, not one that
 * captures already), into a new graph. */
static stub_status stub_op_begin_capture(const char *name, void *stream, int mode) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (mode < STUB_MODE_GLOBAL || mode > STUB_MODE_RELAXED) return stub_end(ST_INVALID_VALUE);
    if (stream == NULL) return stub_end(ST_CAPTURE_UNSUPPORTED);
    long s = stub_stream_of(stream, dev);
    if (s < 0) return stub_end(ST_BAD_HANDLE);
    stub_stream *st = &stub_streams[s];
    if (st->capture != STUB_CAPTURE_NONE) return stub_end(ST_ILLEGAL_STATE);
    st->capture = STUB_CAPTURE_ACTIVE;
    st->capture_mode = mode;
    st->capture_thread = pthread_self();
    st->capture_id = ++stub_capture_ids;
    st->capture_origin = 1;
    st->capture_seq = 0;
    st->unjoined = 0;
    st->capture_graph = stub_graph_create_locked(0);
    stub_graphs[st->capture_graph].capturing = 1;
    st->nterminals = 0;
    return stub_end(ST_OK);
}

/* End the capture begun on `stream`: the graph in `*graph`, or NULL and
 * ST_CAPTURE_INVALIDATED (the capture was invalidated) or
 * ST_CAPTURE_UNJOINED (a stream that joined it has work the origin did not
 * wait for), the graph then gone with its nodes; every stream of the
 * capture stops capturing. */
static stub_status stub_op_end_capture(const char *name, void *stream, void **graph) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (!graph) return stub_end(ST_INVALID_VALUE);
    long s = stream ? stub_stream_of(stream, dev) : STUB_BAD_STREAM;
    if (s < 0) return stub_end(ST_BAD_HANDLE);
    stub_stream *st = &stub_streams[s];
    if (st->capture == STUB_CAPTURE_NONE) return stub_end(ST_ILLEGAL_STATE);
    if (!st->capture_origin) return stub_end(ST_CAPTURE_UNMATCHED);
    if (st->capture_mode != STUB_MODE_RELAXED && !pthread_equal(st->capture_thread, pthread_self()))
        return stub_end(ST_CAPTURE_WRONG_THREAD);
    int invalidated = st->capture == STUB_CAPTURE_INVALIDATED, unjoined = 0;
    uint64_t id = st->capture_id;
    for (size_t i = 0; i < stub_nstreams; i++)
        if (stub_streams[i].capture != STUB_CAPTURE_NONE && stub_streams[i].capture_id == id) {
            unjoined |= stub_streams[i].unjoined;
            stub_streams[i].capture = STUB_CAPTURE_NONE;
            stub_streams[i].capture_origin = 0;
            stub_streams[i].unjoined = 0;
            stub_streams[i].nterminals = 0;
        }
    stub_graph *g = &stub_graphs[st->capture_graph];
    g->capturing = 0;
    g->live = !invalidated && !unjoined;
    *graph = g->live ? stub_handle(STUB_GRAPH_BASE, (size_t)st->capture_graph) : NULL;
    return stub_end(invalidated ? ST_CAPTURE_INVALIDATED : unjoined ? ST_CAPTURE_UNJOINED : ST_OK);
}

/* The capture status of `stream` (STUB_CAPTURE_*; the legacy stream never
 * captures). */
static stub_status stub_op_is_capturing(const char *name, void *stream, int *status) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (!status) return stub_end(ST_INVALID_VALUE);
    long s = stub_stream_of(stream, dev);
    if (s == STUB_BAD_STREAM) return stub_end(ST_BAD_HANDLE);
    *status = s >= 0 ? stub_streams[s].capture : STUB_CAPTURE_NONE;
    return stub_end(ST_OK);
}

/* Exchange the calling thread's capture interaction mode with `*mode`. */
static stub_status stub_op_exchange_mode(const char *name, int *mode) {
    STUB_BEGIN(name);
    if (!mode || *mode < STUB_MODE_GLOBAL || *mode > STUB_MODE_RELAXED) return stub_end(ST_INVALID_VALUE);
    int old = stub_thread_mode;
    stub_thread_mode = *mode;
    *mode = old;
    return stub_end(ST_OK);
}

/* The live graph (or instantiated graph, `exec`) of a handle, or -1. */
static long stub_graph_of(const void *h, int exec) {
    long i = stub_index(h, STUB_GRAPH_BASE, stub_ngraphs);
    if (i < 0 || !stub_graphs[i].live || stub_graphs[i].exec != exec) {
        stub_bad_handles++;
        return -1;
    }
    return i;
}

/* Instantiate `graph` into `*exec`. */
static stub_status stub_op_graph_instantiate(const char *name, void **exec, void *graph) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    if (!exec) return stub_end(ST_INVALID_VALUE);
    long g = stub_graph_of(graph, 0);
    if (g < 0) return stub_end(ST_BAD_HANDLE);
    /* A graph a capture is still building cannot be instantiated. */
    if (stub_graphs[g].capturing) return stub_end(ST_ILLEGAL_STATE);
    *exec = stub_handle(STUB_GRAPH_BASE, (size_t)stub_graph_create_locked(1));
    return stub_end(ST_OK);
}

/* Launch (replay) an instantiated graph on `stream`: stream-ordered work. */
static stub_status stub_op_graph_launch(const char *name, void *exec, void *stream) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (stub_graph_of(exec, 1) < 0) return stub_end(ST_BAD_HANDLE);
    long s = stub_stream_of(stream, dev);
    if (s == STUB_BAD_STREAM) return stub_end(ST_BAD_HANDLE);
    return stub_end(stub_work_locked(s, dev));
}

/* Destroy a graph (`exec`: an instantiated one), and its nodes; not one a
 * capture still builds. */
static stub_status stub_op_graph_destroy(const char *name, void *graph, int exec) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    long g = stub_graph_of(graph, exec);
    if (g < 0) return stub_end(ST_BAD_HANDLE);
    if (stub_graphs[g].capturing) return stub_end(ST_ILLEGAL_STATE);
    stub_graphs[g].live = 0;
    return stub_end(ST_OK);
}

/* The capture `stream` is part of: its status (STUB_CAPTURE_*) in
 * `*status`; while it is part of one, the capture's id, its graph and, in
 * `*deps` (`*num` of them, NULL when none), the stream's terminal nodes,
 * an array valid until the next such call on the stream; else zeros. The
 * other outputs may be NULL. (The legacy stream never captures.) */
static stub_status stub_op_capture_info(const char *name, void *stream, int *status, uint64_t *id, void **graph,
                                        void *const **deps, size_t *num) {
    STUB_BEGIN(name);
    STUB_DEVICE(dev);
    if (!status) return stub_end(ST_INVALID_VALUE);
    long s = stub_stream_of(stream, dev);
    if (s == STUB_BAD_STREAM) return stub_end(ST_BAD_HANDLE);
    if (!stub_in_capture(s)) {
        *status = STUB_CAPTURE_NONE;
        if (id) *id = 0;
        if (graph) *graph = NULL;
        if (deps) *deps = NULL;
        if (num) *num = 0;
        return stub_end(ST_OK);
    }
    stub_stream *st = &stub_streams[s];
    *status = st->capture;
    if (id) *id = st->capture_id;
    if (graph) *graph = stub_handle(STUB_GRAPH_BASE, (size_t)st->capture_graph);
    if (deps) {
        if (!st->terminal_out && !(st->terminal_out = calloc(STUB_MAX_DEPS, sizeof(void *)))) abort();
        for (int i = 0; i < st->nterminals; i++)
            st->terminal_out[i] = stub_handle(STUB_NODE_BASE, (size_t)st->terminals[i]);
        *deps = st->nterminals ? st->terminal_out : NULL;
    }
    if (num) *num = (size_t)st->nterminals;
    return stub_end(ST_OK);
}

/* The node of a handle, while its graph lives, or -1. */
static long stub_node_of(const void *h) {
    long i = stub_index(h, STUB_NODE_BASE, stub_nnodes);
    if (i < 0 || !stub_graphs[stub_nodes[i].graph].live) {
        stub_bad_handles++;
        return -1;
    }
    return i;
}

/* The nodes `node` depends on: with `deps` NULL, their number in `*num`;
 * else up to `*num` of them in `deps` (slots past the last NULL), and in
 * `*num` how many were written. An unknown node is an invalid value. */
static stub_status stub_op_node_deps(const char *name, void *node, void **deps, size_t *num) {
    STUB_BEGIN(name);
    stub_status r = stub_ready_locked();
    if (r != ST_OK) return stub_end(r);
    if (!num) return stub_end(ST_INVALID_VALUE);
    long n = stub_node_of(node);
    if (n < 0) return stub_end(ST_INVALID_VALUE);
    const stub_node *nd = &stub_nodes[n];
    size_t have = (size_t)nd->ndeps;
    if (!deps) {
        *num = have;
        return stub_end(ST_OK);
    }
    size_t k = *num < have ? *num : have;
    for (size_t i = 0; i < *num; i++) deps[i] = i < k ? stub_handle(STUB_NODE_BASE, (size_t)nd->deps[i]) : NULL;
    *num = k;
    return stub_end(ST_OK);
}

/* ------------------------------------------------------------ control API */

/* Whether device `dev` can access device `peer` (all pairs can at reset). */
STUB_EXPORT void cachealloc_stub_set_peer_capable(int dev, int peer, int can) {
    pthread_mutex_lock(&stub_lock);
    stub_init_once_locked();
    if (dev >= 0 && dev < STUB_MAX_DEVICES && peer >= 0 && peer < STUB_MAX_DEVICES)
        stub_peer_denied[dev][peer] = !can;
    pthread_mutex_unlock(&stub_lock);
}

/* Which physical allocation the page mapped at `addr` is: 0 with the pid
 * of the process that created it and its number there (an imported page
 * names its exporter's), and whether it was imported; -1 when nothing is
 * mapped at `addr`. */
STUB_EXPORT int cachealloc_stub_vmm_source(uint64_t addr, uint64_t *pid, uint64_t *index, int *imported) {
    int r = -1;
    pthread_mutex_lock(&stub_lock);
    for (size_t i = 0; i < stub_nmappings; i++) {
        stub_mapping *m = &stub_mappings[i];
        if (m->live && addr >= m->addr && addr < m->addr + m->size) {
            stub_physical *ph = &stub_physicals[m->physical];
            *pid = ph->src_pid;
            *index = ph->src_index;
            *imported = ph->imported;
            r = 0;
        }
    }
    pthread_mutex_unlock(&stub_lock);
    return r;
}

/* Bytes of address space reserved and not freed, on every device. */
STUB_EXPORT uint64_t cachealloc_stub_reserved_bytes(void) {
    uint64_t n = 0;
    pthread_mutex_lock(&stub_lock);
    for (size_t i = 0; i < stub_nreservations; i++)
        if (stub_reservations[i].live) n += stub_reservations[i].size;
    pthread_mutex_unlock(&stub_lock);
    return n;
}

/* Which process's allocation the opened handle at `addr` maps: 0 with its
 * pid and address, -1 when `addr` is not in an opened handle. */
STUB_EXPORT int cachealloc_stub_ipc_source(uint64_t addr, uint64_t *pid, uint64_t *src_addr) {
    int r = -1;
    pthread_mutex_lock(&stub_lock);
    for (size_t i = 0; i < stub_nimports; i++) {
        stub_import *m = &stub_imports[i];
        if (m->live && addr >= m->addr && addr < m->addr + m->size) {
            *pid = m->src_pid;
            *src_addr = m->src_addr + (addr - m->addr);
            r = 0;
        }
    }
    pthread_mutex_unlock(&stub_lock);
    return r;
}


STUB_EXPORT void cachealloc_stub_reset(int devices, uint64_t capacity) {
    pthread_mutex_lock(&stub_lock);
    stub_init_once_locked();
    stub_reset_locked(devices, capacity);
    pthread_mutex_unlock(&stub_lock);
}

STUB_EXPORT void cachealloc_stub_set_capacity(uint64_t capacity) {
    pthread_mutex_lock(&stub_lock);
    stub_init_once_locked();
    for (int d = 0; d < STUB_MAX_DEVICES; d++) stub_dev[d].capacity = capacity;
    pthread_mutex_unlock(&stub_lock);
}

/* Make the `nth` call from now of `name` (NULL or "": of any entry point)
 * return `code`. */
STUB_EXPORT void cachealloc_stub_fail(const char *name, uint64_t nth, int code) {
    pthread_mutex_lock(&stub_lock);
    stub_init_once_locked();
    if (stub_nfaults < 64) {
        stub_fault *f = &stub_faults[stub_nfaults++];
        memset(f, 0, sizeof(*f));
        if (name && name[0]) {
            strncpy(f->name, name, sizeof(f->name) - 1);
            uint64_t base = 0;
            for (size_t i = 0; i < stub_ncall_counts; i++)
                if (strcmp(stub_call_counts[i].name, name) == 0) base = stub_call_counts[i].count;
            f->nth = base + nth;
        } else {
            f->nth = stub_calls + nth;
        }
        f->code = code;
    }
    pthread_mutex_unlock(&stub_lock);
}

STUB_EXPORT void cachealloc_stub_clear_faults(void) {
    pthread_mutex_lock(&stub_lock);
    stub_nfaults = 0;
    pthread_mutex_unlock(&stub_lock);
}

STUB_EXPORT void cachealloc_stub_counters(stub_counters *out) {
    pthread_mutex_lock(&stub_lock);
    stub_init_once_locked();
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < stub_nallocs; i++)
        if (stub_allocs[i].live) {
            out->live_allocations++;
            out->live_bytes += stub_allocs[i].size;
        }
    for (size_t i = 0; i < stub_nevents; i++) out->live_events += stub_events[i].live != 0;
    for (size_t i = 0; i < stub_nstreams; i++) out->live_streams += stub_streams[i].live != 0;
    for (int d = 0; d < STUB_MAX_DEVICES; d++) out->retained_contexts += stub_dev[d].ctx_refs;
    for (size_t i = 0; i < stub_nreservations; i++) out->live_reservations += stub_reservations[i].live != 0;
    for (size_t i = 0; i < stub_nphysicals; i++)
        if (stub_physicals[i].size) {
            out->live_physical++;
            out->live_bytes += stub_physicals[i].size;
        }
    for (size_t i = 0; i < stub_nmappings; i++) out->live_mappings += stub_mappings[i].live != 0;
    for (size_t i = 0; i < stub_nimports; i++) out->live_imports += stub_imports[i].live != 0;
    for (size_t i = 0; i < stub_nstreams; i++)
        out->live_captures += stub_streams[i].live && stub_streams[i].capture_origin &&
                              stub_streams[i].capture != STUB_CAPTURE_NONE;
    out->capture_violations = stub_capture_violations;
    for (size_t i = 0; i < stub_ngraphs; i++) out->live_graphs += stub_graphs[i].live != 0;
    out->bad_handles = stub_bad_handles;
    out->calls = stub_calls;
    out->injected = stub_injected;
    pthread_mutex_unlock(&stub_lock);
}

/* The calling thread's current device (-1: none). */
STUB_EXPORT int cachealloc_stub_current_device(void) {
    return stub_current;
}

#endif

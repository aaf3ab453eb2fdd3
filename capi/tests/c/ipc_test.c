/*
 * Sharing memory between processes, peer access and device-to-device
 * copies through the C ABI of libcachealloc. Built and run by
 * capi/tests/capi.rs:
 *
 *   ipc_test mock
 *       one process, devices 0 and 1 of one simulated machine: device 0
 *       shares, device 1 opens;
 *   ipc_test cuda export FILE
 *       on the project's stub libcuda.so.1: share a block, write the handle
 *       to FILE and run `ipc_test cuda consume FILE`, a second process that
 *       opens it; then free the block (held until the share is released),
 *       release the share, and check that nothing is left;
 *   ipc_test cuda export-pages FILE   (CACHEALLOC_CONF=expandable_segments:True)
 *       the same for a block of an expandable segment: its pages' header
 *       and descriptors go to FILE, `ipc_test cuda consume-pages FILE`
 *       takes them from this process (pidfd_getfd) and maps them.
 *
 * It prints `ok WHAT` per check and exits 1 at the first failure.
 */
#define _GNU_SOURCE
#include "cachealloc.h"
#include "check.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>


static stub_counters counters(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib, "the stub libcuda.so.1 is not loaded: %s", dlerror());
    void (*f)(stub_counters *) = (void (*)(stub_counters *))dlsym(lib, "cachealloc_stub_counters");
    CHECK(f, "libcuda.so.1 is not the stub driver");
    stub_counters c;
    f(&c);
    return c;
}

/* Peer access and copies between devices 0 and 1 (both backends). */
static void peers(void) {
    CHECK(cachealloc_enable_peer_access(0, 1) == 0, "enable peer access 0 -> 1");
    CHECK(cachealloc_enable_peer_access(0, 1) == 0, "already enabled is no error");
    CHECK(cachealloc_enable_peer_access(0, 0) == -1, "a device's access to itself");
    printf("ok peer access (itself: %s)\n", last_error());
    CHECK(cachealloc_enable_peer_access(0, -1) == -1 && error_has("negative"), "peer -1");
    void *a = cachealloc_alloc(4096, 0, NULL);
    void *b = cachealloc_alloc(4096, 1, NULL);
    CHECK(a && b, "alloc on devices 0 and 1");
    CHECK(cachealloc_memcpy_async(b, 1, a, 0, 4096, NULL, 0) == 0, "copy 0 -> 1");
    CHECK(cachealloc_memcpy_async(b, 1, a, 0, 4096, NULL, 1) == 0, "copy 0 -> 1 with p2p");
    CHECK(cachealloc_memcpy_async(b, 1, a, 0, 4096, NULL, 0) == 0, "copy 0 -> 1");
    printf("ok device-to-device copies\n");
    cachealloc_free(a, 4096, 0, NULL);
    cachealloc_free(b, 4096, 1, NULL);
}

/* Bad calls: each -1 / NULL with a message. */
static void bad_calls(void) {
    cachealloc_ipc_handle h;
    CHECK(cachealloc_share_ipc_handle((void *)0x1234, &h) == -1 && error_has("not allocated by"),
          "share of an unknown pointer");
    void *x = cachealloc_alloc(4096, 0, NULL);
    CHECK(cachealloc_share_ipc_handle(x, NULL) == -1 && error_has("NULL"), "share into NULL");
    CHECK(cachealloc_share_ipc_handle((char *)x + 512, &h) == -1, "share of an interior pointer");
    CHECK(cachealloc_open_ipc_handle(NULL, 1) == NULL && error_has("NULL"), "open of NULL");
    CHECK(cachealloc_close_ipc_handle(NULL, 0) == -1 && error_has("NULL"), "close of NULL");
    CHECK(cachealloc_release_ipc_share(x) == -1 && error_has("no share outstanding"),
          "release of a block never shared");
    memset(&h, 0x5a, sizeof h);
    CHECK(cachealloc_open_ipc_handle(&h, 1) == NULL, "open of a junk handle");
    printf("ok bad calls (junk handle: %s)\n", last_error());
    cachealloc_free(x, 4096, 0, NULL);
}

static void mock(void) {
    void *first = cachealloc_alloc(4096, 0, NULL);
    void *x = cachealloc_alloc(1 << 20, 0, NULL);
    CHECK(first && x, "alloc");
    cachealloc_ipc_handle h;
    CHECK(cachealloc_share_ipc_handle(x, &h) == 0 && h.offset == 4096, "share");
    void *p = cachealloc_open_ipc_handle(&h, 1);
    CHECK(p == x, "device 1 sees the same range (%p, %p)", p, x);
    CHECK(cachealloc_open_ipc_handle(&h, 1) == p, "opened again: the same mapping");
    CHECK(cachealloc_close_ipc_handle(&h, 1) == 0 && cachealloc_close_ipc_handle(&h, 1) == 0,
          "close twice");
    CHECK(cachealloc_close_ipc_handle(&h, 1) == -1 && error_has("not open"), "close a third time");
    printf("ok shared from device 0, opened on device 1\n");
    cachealloc_free(x, 1 << 20, 0, NULL); /* held: the share is outstanding */
    CHECK(cachealloc_free_checked(x, 1 << 20, 0, NULL) == -1, "a second free");
    CHECK(cachealloc_release_ipc_share(x) == 0, "release the share: now freed");
    cachealloc_free(first, 4096, 0, NULL);
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache");
    CHECK(cachealloc_open_ipc_handle(&h, 1) == NULL && error_has("stale"), "a stale handle");
    printf("ok freed after the release; stale: %s\n", last_error());
    bad_calls();
    peers();
}

static void cuda_export(const char *self, const char *file) {
    void *first = cachealloc_alloc(4096, 0, NULL);
    void *x = cachealloc_alloc(1 << 20, 0, NULL);
    CHECK(first && x, "alloc");
    cachealloc_ipc_handle h;
    CHECK(cachealloc_share_ipc_handle(x, &h) == 0 && h.offset == 4096, "share");
    CHECK(cachealloc_open_ipc_handle(&h, 0) == NULL && error_has("INVALID_CONTEXT"),
          "the exporting process opens its own handle");
    FILE *f = fopen(file, "wb");
    CHECK(f && fwrite(&h, sizeof h, 1, f) == 1 && fclose(f) == 0, "write %s", file);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' cuda consume '%s'", self, file);
    fflush(stdout);
    int status = system(cmd);
    CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the consumer process");
    cachealloc_free(x, 1 << 20, 0, NULL); /* held until the release */
    CHECK(cachealloc_empty_cache(0) == 0 && counters().live_allocations == 1, "held while shared");
    CHECK(cachealloc_release_ipc_share(x) == 0, "release");
    cachealloc_free(first, 4096, 0, NULL);
    CHECK(cachealloc_empty_cache(0) == 0, "empty_cache");
    CHECK(counters().live_allocations == 0, "the segment is released");
    printf("ok exporter: held until released, then released\n");
    bad_calls();
    peers();
    CHECK(cachealloc_empty_cache(-1) == 0, "empty_cache");
    stub_counters c = counters();
    CHECK(c.live_allocations == 0 && c.live_imports == 0, "nothing left");
}

static void cuda_consume(const char *file) {
    cachealloc_ipc_handle h;
    FILE *f = fopen(file, "rb");
    CHECK(f && fread(&h, sizeof h, 1, f) == 1, "read %s", file);
    fclose(f);
    void *p = cachealloc_open_ipc_handle(&h, 1);
    CHECK(p, "open in the consumer");
    CHECK(cachealloc_open_ipc_handle(&h, 1) == p, "opened again: the same mapping");
    CHECK(counters().live_imports == 1, "one driver open");
    void *y = cachealloc_alloc(4096, 1, NULL);
    CHECK(cachealloc_memcpy_async(p, 1, y, 1, 4096, NULL, 0) == 0, "copy into shared memory");
    cachealloc_free(y, 4096, 1, NULL);
    CHECK(cachealloc_close_ipc_handle(&h, 1) == 0 && cachealloc_close_ipc_handle(&h, 1) == 0,
          "close twice");
    CHECK(counters().live_imports == 0, "closed with the driver");
    printf("ok consumer: opened %p on device 1\n", p);
}

/* A block of an expandable segment, shared as its pages. */
static void cuda_export_pages(const char *self, const char *file) {
    void *first = cachealloc_alloc(8 << 20, 0, NULL);
    void *x = cachealloc_alloc(24 << 20, 0, NULL);
    CHECK(first && x, "alloc");
    cachealloc_ipc_handle h;
    CHECK(cachealloc_share_ipc_handle(x, &h) == -1 &&
              cachealloc_last_error_code() == CACHEALLOC_ERROR_EXPANDABLE_SEGMENT &&
              error_has("expandable segment"),
          "an expandable block has no segment handle, by its code");
    int fds[8];
    cachealloc_ipc_pages p = {0};
    CHECK(cachealloc_share_ipc_pages(x, fds, 1, &p) == -1 &&
              cachealloc_last_error_code() == CACHEALLOC_ERROR_BUFFER_TOO_SMALL && p.pages == 2 &&
              error_has("buffer too small: 2"),
          "room for one descriptor: the code and the count needed (%u): %s", p.pages, last_error());
    CHECK(cachealloc_share_ipc_pages(x, fds, 8, &p) == 0 && p.pages == 2 &&
              p.offset == (8 << 20) && p.page_size == (20 << 20),
          "share the pages: %s", last_error());
    FILE *f = fopen(file, "wb");
    CHECK(f && fwrite(&p, sizeof p, 1, f) == 1 && fwrite(fds, sizeof(int), 2, f) == 2 &&
              fclose(f) == 0,
          "write %s", file);
    cachealloc_free(x, 24 << 20, 0, NULL); /* held until the release */
    cachealloc_free(first, 8 << 20, 0, NULL);
    uint64_t mapped = counters().live_mappings;
    CHECK(cachealloc_empty_cache(0) == 0 && counters().live_mappings == mapped && mapped > 0,
          "the pages stay mapped while shared");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' cuda consume-pages '%s'", self, file);
    fflush(stdout);
    int status = system(cmd);
    CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the consumer process");
    CHECK(cachealloc_release_ipc_share(x) == 0, "release");
    CHECK(cachealloc_empty_cache(0) == 0 && counters().live_mappings == 0,
          "released: the pages are unmapped");
    printf("ok exporter of pages: mapped until released, then unmapped\n");
}

static void cuda_consume_pages(const char *file) {
    cachealloc_ipc_pages p;
    int fds[2];
    FILE *f = fopen(file, "rb");
    CHECK(f && fread(&p, sizeof p, 1, f) == 1 && fread(fds, sizeof(int), 2, f) == 2, "read %s",
          file);
    fclose(f);
    char *q = cachealloc_open_ipc_pages(&p, fds, 0);
    CHECK(q, "open the pages: %s", last_error());
    CHECK(cachealloc_open_ipc_pages(&p, fds, 0) == q, "opened again: the same mapping");
    void *y = cachealloc_alloc(4096, 0, NULL);
    CHECK(cachealloc_memcpy_async(q, 0, y, 0, 4096, NULL, 0) == 0 &&
              cachealloc_memcpy_async(y, 0, q + (23 << 20), 0, 4096, NULL, 0) == 0,
          "copies into and out of the shared block: %s", last_error());
    cachealloc_free(y, 4096, 0, NULL);
    CHECK(cachealloc_close_ipc_pages(&p, fds, 0) == 0 && cachealloc_close_ipc_pages(&p, fds, 0) == 0,
          "close twice");
    CHECK(cachealloc_close_ipc_pages(&p, fds, 0) == -1, "closed");
    CHECK(counters().live_mappings == 0 || cachealloc_empty_cache(0) == 0, "unmapped");
    printf("ok consumer: opened the pages at %p\n", (void *)q);
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "mock") == 0) {
        mock();
    } else if (argc >= 4 && strcmp(argv[1], "cuda") == 0 && strcmp(argv[2], "export") == 0) {
        cuda_export(argv[0], argv[3]);
    } else if (argc >= 4 && strcmp(argv[1], "cuda") == 0 && strcmp(argv[2], "consume") == 0) {
        cuda_consume(argv[3]);
        return 0;
    } else if (argc >= 4 && strcmp(argv[1], "cuda") == 0 && strcmp(argv[2], "export-pages") == 0) {
        cuda_export_pages(argv[0], argv[3]);
    } else if (argc >= 4 && strcmp(argv[1], "cuda") == 0 && strcmp(argv[2], "consume-pages") == 0) {
        cuda_consume_pages(argv[3]);
        return 0;
    } else {
        fprintf(stderr, "usage: ipc_test mock | ipc_test cuda export|consume FILE\n");
        return 2;
    }
    printf("ipc_test: all checks passed\n");
    return 0;
}

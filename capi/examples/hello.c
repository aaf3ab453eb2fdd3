/* cachealloc from C: the README's C quick start.
 *
 *   cargo build --release -p cachealloc-capi
 *   gcc -Icapi/include capi/examples/hello.c -L"${CARGO_TARGET_DIR:-target}/release" -lcachealloc -o hello
 *   CACHEALLOC_BACKEND=mock LD_LIBRARY_PATH="${CARGO_TARGET_DIR:-target}/release" ./hello
 */
#include <stdio.h>
#include <string.h>

#include "cachealloc.h"

/* Called once per torch.cuda.memory_stats() key. */
static void print_stat(const char *key, int64_t value, void *user) {
    (void)user;
    if (strcmp(key, "allocated_bytes.all.current") == 0 ||
        strcmp(key, "reserved_bytes.all.current") == 0)
        printf("  %s = %lld\n", key, (long long)value);
}

int main(void) {
    int device = 0;
    void *stream = NULL; /* a cudaStream_t; NULL is the default stream */

    void *p = cachealloc_alloc(1 << 20, device, stream);
    if (p == NULL) {
        fprintf(stderr, "alloc failed: %s\n", cachealloc_last_error());
        return 1;
    }
    printf("1 MiB at %p\n", p);
    cachealloc_memory_stats(device, print_stat, NULL);

    cachealloc_free(p, 1 << 20, device, stream); /* back to the cache */
    if (cachealloc_empty_cache(device) != 0) {   /* back to the device */
        fprintf(stderr, "empty_cache failed: %s\n", cachealloc_last_error());
        return 1;
    }
    printf("after free and empty_cache:\n");
    cachealloc_memory_stats(device, print_stat, NULL);

    /* Too much: NULL, and PyTorch's message. */
    if (cachealloc_alloc((size_t)1 << 62, device, stream) == NULL)
        printf("1 EiB: %s\n", cachealloc_last_error());
    return 0;
}

/* host_mem.c — see host_mem.h. Each block carries a header just before the
 * pointer handed out: for a small block (malloc) the malloc pointer, for a
 * large one (mmap) its mapping, in the 4 KiB page mapped before the block. */
#include "base/host_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HOST_MAGIC_SMALL 0x6b6c6e736d616c6cULL /* "klnsmall" */
#define HOST_MAGIC_MAPPED 0x6b6c6e6d61707064ULL
#define HOST_PAGE ((size_t)4096)

typedef struct {
    void *base;  /* what malloc returned, or where the mapping starts */
    size_t len;  /* the mapping's length (0 for a small block) */
    uint64_t magic;
} host_hdr;

static host_hdr *hdr_of(void *p) { return (host_hdr *)((char *)p - sizeof(host_hdr)); }

static void *alloc_mapped(size_t bytes) {
    const size_t rounded = (bytes + KN_HOST_HUGE_MIN - 1) & ~(KN_HOST_HUGE_MIN - 1);
    if (rounded < bytes || rounded > SIZE_MAX - KN_HOST_HUGE_MIN - HOST_PAGE) return NULL;
    const size_t span = rounded + KN_HOST_HUGE_MIN + HOST_PAGE;
    char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    /* p: the first 2 MiB boundary with a page before it for the header; the
     * rest of the span around [p - page, p + rounded) is given back */
    char *p = (char *)(((uintptr_t)m + HOST_PAGE + KN_HOST_HUGE_MIN - 1) & ~(uintptr_t)(KN_HOST_HUGE_MIN - 1));
    char *lo = p - HOST_PAGE, *hi = p + rounded;
    if (lo > m) (void)munmap(m, (size_t)(lo - m));
    if (m + span > hi) (void)munmap(hi, (size_t)(m + span - hi));
    (void)madvise(p, rounded, MADV_HUGEPAGE);
    *hdr_of(p) = (host_hdr){.base = lo, .len = rounded + HOST_PAGE, .magic = HOST_MAGIC_MAPPED};
    return p;
}

/* Under AddressSanitizer every block comes from malloc (large ones 2 MiB
 * aligned inside it), which it guards with redzones; it does not guard
 * mappings of our own. */
#if defined(__SANITIZE_ADDRESS__)
#define HOST_MAP_LARGE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOST_MAP_LARGE 0
#endif
#endif
#ifndef HOST_MAP_LARGE
#define HOST_MAP_LARGE 1
#endif

void *kn_host_alloc(size_t bytes) {
    if (HOST_MAP_LARGE && bytes >= KN_HOST_HUGE_MIN) return alloc_mapped(bytes);
    const size_t align = bytes >= KN_HOST_HUGE_MIN ? KN_HOST_HUGE_MIN : 64;
    if (bytes > SIZE_MAX - sizeof(host_hdr) - align) return NULL;
    char *raw = malloc(bytes + sizeof(host_hdr) + align);
    if (!raw) return NULL;
    char *p = (char *)(((uintptr_t)raw + sizeof(host_hdr) + align - 1) & ~(uintptr_t)(align - 1));
    *hdr_of(p) = (host_hdr){.base = raw, .len = 0, .magic = HOST_MAGIC_SMALL};
    return p;
}

void kn_host_free(void *p) {
    if (!p) return;
    const host_hdr h = *hdr_of(p);
    if (h.magic == HOST_MAGIC_SMALL && h.len == 0) {
        free(h.base);
    } else if (h.magic == HOST_MAGIC_MAPPED) {
        (void)munmap(h.base, h.len);
    } else {
        fprintf(stderr, "kiln: kn_host_free of a pointer kn_host_alloc did not return (%p)\n", p);
        abort();
    }
}

int64_t kn_host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[128];
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
    fclose(f);
    return kib < 0 ? -1 : (int64_t)kib * 1024;
}

/* host_mem.h — host memory for weights and caches: large allocations on
 * transparent huge pages, and how much memory the system can still give.
 *
 * Decode streams every weight once per token. On 4 KiB pages that is a TLB
 * miss and a stop of the hardware prefetcher's stream every 4 KiB; on 2 MiB
 * pages, 512 times fewer. Measured on the 2-core dev VM (0.44B bf16 decode,
 * per-op rates within one run): the GEMVs over weights on 4 KiB pages read
 * 2-8% slower than those on huge pages. */
#ifndef KN_HOST_MEM_H
#define KN_HOST_MEM_H

#include <stddef.h>
#include <stdint.h>

/* from this size on, kn_host_alloc maps whole 2 MiB pages of its own */
#define KN_HOST_HUGE_MIN ((size_t)2 << 20)

/* 64-byte aligned memory for kn_host_free (NULL when none). From
 * KN_HOST_HUGE_MIN bytes on, a mapping of its own (fresh pages, never a
 * malloc heap's pages that smaller buffers already touched in 4 KiB pages),
 * 2 MiB aligned and advised to transparent huge pages (a hint: with THP off
 * the pages stay 4 KiB); under AddressSanitizer, 2 MiB aligned malloc memory
 * (which it guards). */
void *kn_host_alloc(size_t bytes);

/* Frees what kn_host_alloc returned (NULL: nothing); aborts on a pointer
 * it did not return. */
void kn_host_free(void *p);

/* The kernel's estimate of the bytes it can give without swapping
 * (MemAvailable of /proc/meminfo: free memory plus reclaimable caches), or -1
 * when unknown. */
int64_t kn_host_mem_available(void);

#endif

/* gpu_mem_limit on CPU: the C allocator refuses what would take a rank past its cap.
 *
 * Preloaded into a preset's CPU ranks (LD_PRELOAD) when a cap is asked for.  It counts the bytes
 * malloc, calloc, realloc and the aligned allocators hand out (malloc_usable_size) and take back,
 * and once armed (shardtop_cap_arm, from the rank, after its imports) answers NULL / ENOMEM to a
 * request that would take what was handed out since arming past the cap: torch then raises its own
 * CPU out-of-memory error at the allocation, inside the module that asked, as CUDA's allocator
 * does on a GPU.  Thread stacks and other mappings are not allocations and are not counted.
 * Nothing is capped until armed, so the processes a rank starts (a compiler) run as they would.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

static _Atomic long long held = 0;
static _Atomic long long peak = 0;
static _Atomic long long base = 0;
static _Atomic long long limit = -1;

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);

/* dlsym allocates with calloc before the real calloc is known: a little static room for that. */
static char boot[16384];
static size_t boot_used = 0;

static int from_boot(void *p) { return (char *)p >= boot && (char *)p < boot + sizeof boot; }

static void find_real(void) {
    if (real_malloc) return;
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_free = dlsym(RTLD_NEXT, "free");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    real_memalign = dlsym(RTLD_NEXT, "memalign");
}

static int over(size_t n) {
    long long cap = atomic_load(&limit);
    return cap >= 0 && atomic_load(&held) - atomic_load(&base) + (long long)n > cap;
}

static void *took(void *p) {
    if (p) {
        long long n = (long long)malloc_usable_size(p);
        long long now = atomic_fetch_add(&held, n) + n;
        long long high = atomic_load(&peak);
        while (now > high && !atomic_compare_exchange_weak(&peak, &high, now)) {}
    }
    return p;
}

static void gave(void *p) {
    if (p) atomic_fetch_sub(&held, (long long)malloc_usable_size(p));
}

void *malloc(size_t n) {
    find_real();
    if (over(n)) { errno = ENOMEM; return NULL; }
    return took(real_malloc(n));
}

void free(void *p) {
    if (!p || from_boot(p)) return;
    find_real();
    gave(p);
    real_free(p);
}

void *calloc(size_t count, size_t size) {
    if (!real_calloc) {
        size_t n = (count * size + 15) & ~(size_t)15;
        if (boot_used + n > sizeof boot) return NULL;
        void *p = boot + boot_used;
        boot_used += n;
        memset(p, 0, n);
        return p;
    }
    if (over(count * size)) { errno = ENOMEM; return NULL; }
    return took(real_calloc(count, size));
}

void *realloc(void *p, size_t n) {
    find_real();
    if (from_boot(p)) {
        void *moved = malloc(n);
        if (moved) memcpy(moved, p, n);
        return moved;
    }
    long long before = p ? (long long)malloc_usable_size(p) : 0;
    if (over(n > (size_t)before ? n - (size_t)before : 0)) { errno = ENOMEM; return NULL; }
    gave(p);
    void *q = real_realloc(p, n);
    if (!q && p && n) { took(p); return NULL; }  /* the old block stays the caller's */
    return took(q);
}

int posix_memalign(void **out, size_t alignment, size_t n) {
    find_real();
    if (over(n)) return ENOMEM;
    int failed = real_posix_memalign(out, alignment, n);
    if (!failed) took(*out);
    return failed;
}

void *aligned_alloc(size_t alignment, size_t n) {
    find_real();
    if (over(n)) { errno = ENOMEM; return NULL; }
    return took(real_aligned_alloc(alignment, n));
}

void *memalign(size_t alignment, size_t n) {
    find_real();
    if (over(n)) { errno = ENOMEM; return NULL; }
    return took(real_memalign(alignment, n));
}

/* Cap what is handed out from now on at `bytes` (negative: no cap). */
void shardtop_cap_arm(long long bytes) {
    atomic_store(&base, atomic_load(&held));
    atomic_store(&peak, atomic_load(&held));
    atomic_store(&limit, bytes);
}

/* Room for what must still be allocated at the cap (recording an out-of-memory error). */
void shardtop_cap_widen(long long bytes) {
    if (atomic_load(&limit) >= 0) atomic_fetch_add(&limit, bytes);
}

/* Bytes handed out since arming, their highest, and the cap (negative: none). */
long long shardtop_cap_held(void) { return atomic_load(&held) - atomic_load(&base); }
long long shardtop_cap_peak(void) { return atomic_load(&peak) - atomic_load(&base); }
long long shardtop_cap_limit(void) { return atomic_load(&limit); }

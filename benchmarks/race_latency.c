/* The memory floor of an exponential-race completion, without the simulator around it.
 *
 * Built and run by `python benchmarks/bench_sim.py race-latency` (docs/benchmarks-sim.md, "The
 * memory floor"). A fleet of GPUS GPUs holds 16 requests in flight per GPU (the paper instance's
 * occupancy). Each pick draws an entry (request, GPU) uniformly from the in-flight pairs, then
 * reads and writes the request's row (3 cache lines of 192 bytes, prefetched together as soon as
 * the pair is known, as the engine does) and the GPU's row (128 bytes). The next pick's index
 * depends on what this one read, as each event of the simulator depends on the state the last one
 * left: so the picks cannot overlap, and the cost per pick is the latency of the chain pair ->
 * rows. LOOKAHEAD = 1 prefetches the next pick's pair one pick ahead (an exact prediction, which the
 * engine cannot have: the next pick depends on what the current event changes).
 *
 *     race_latency GPUS PICKS LOOKAHEAD ID_BYTES(4|8) HUGE(0|1)
 *
 * ID_BYTES: the width of a request or GPU id in the pairs (the engine's are 4). HUGE = 1 advises
 * huge pages for the pairs and the rows (numpy does it for arrays from 4 MB).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static uint64_t state = 88172645463325252ull;
static inline uint64_t xorshift(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void *block(size_t bytes, int huge) {
    const size_t page = (size_t)2 << 20;
    bytes = (bytes + page - 1) / page * page;
    void *p = aligned_alloc(page, bytes);
    if (p == NULL) {
        perror("aligned_alloc");
        exit(1);
    }
#ifdef MADV_HUGEPAGE
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s GPUS PICKS LOOKAHEAD ID_BYTES HUGE\n", argv[0]);
        return 2;
    }
    const long gpus = atol(argv[1]), picks = atol(argv[2]);
    const int lookahead = atoi(argv[3]), wide = atoi(argv[4]) == 8, huge = atoi(argv[5]);
    const long inflight = 16 * gpus, slots = inflight + inflight / 4;
    int32_t *p32 = NULL;
    int64_t *p64 = NULL;
    if (wide) p64 = block(16 * (size_t)inflight, huge); else p32 = block(8 * (size_t)inflight, huge);
    int64_t *rows = block(192 * (size_t)slots, huge), *gpu_rows = block(128 * (size_t)gpus, 0);
    for (long i = 0; i < 24 * slots; i++) rows[i] = i;
    for (long i = 0; i < 16 * gpus; i++) gpu_rows[i] = i;
    for (long j = 0; j < inflight; j++) {
        int64_t r = (int64_t)(xorshift() % slots), g = (int64_t)(xorshift() % gpus);
        if (wide) { p64[2 * j] = r; p64[2 * j + 1] = g; } else { p32[2 * j] = (int32_t)r; p32[2 * j + 1] = (int32_t)g; }
    }
    enum { NU = 65536 };
    uint64_t *u = malloc(sizeof(uint64_t) * NU);
    for (int i = 0; i < NU; i++) u[i] = xorshift() % inflight;
    int64_t acc = 0;
    const double t0 = cpu_seconds();
    for (long it = 0; it < picks; it++) {
        const long j = (long)((u[it % NU] + (acc & 1)) % inflight);  /* depends on the last pick */
        if (lookahead) {
            const long jn = (long)(u[(it + 1) % NU] % inflight);
            __builtin_prefetch(wide ? (void *)&p64[2 * jn] : (void *)&p32[2 * jn]);
        }
        const int64_t r = wide ? p64[2 * j] : p32[2 * j], g = wide ? p64[2 * j + 1] : p32[2 * j + 1];
        int64_t *rr = rows + 24 * r, *gg = gpu_rows + 16 * g;
        __builtin_prefetch(rr);
        __builtin_prefetch(rr + 8);
        __builtin_prefetch(rr + 16);
        __builtin_prefetch(gg);
        acc += rr[0] + rr[8] + rr[16] + gg[0];
        rr[1] = acc;
        gg[1] = acc;
        if (it % NU == NU - 1)
            for (int i = 0; i < NU; i++) u[i] = xorshift() % inflight;
    }
    const double dt = cpu_seconds() - t0;
    printf("{\"gpus\": %ld, \"in_flight\": %ld, \"lookahead\": %d, \"id_bytes\": %d, \"huge\": %d, "
           "\"ns_per_pick\": %.1f, \"check\": %lld}\n",
           gpus, inflight, lookahead, wide ? 8 : 4, huge, 1e9 * dt / picks, (long long)acc);
    return 0;
}

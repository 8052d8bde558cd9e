/*
 * What the host gives this machine right now, independent of moshi-native:
 *   host_probe fma N   multiply-add throughput of N threads (GFLOP/s each and in total);
 *                      N threads reaching about N times one thread's total have a core each,
 *                      about one thread's total means they share one core.
 *   host_probe bw      read bandwidth (GB/s) of two fresh 1 GiB buffers on huge pages, single
 *                      thread: run it as several processes in a row to see how much the host's
 *                      memory bandwidth moves from one process to the next.
 * Build: cc -O2 -march=native -mprefer-vector-width=512 -ffp-contract=fast -pthread \
 *        -o host_probe tools/bench/host_probe.c
 * (see docs/bench-log.md, "Fresh processes", and BENCHMARKS.md, "Method notes").
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef float v16 __attribute__((vector_size(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Twelve independent multiply-add chains: enough to cover the latency of two FMA pipes. */
static void *fma_thread(void *out) {
    const v16 b = (v16){0} + 1.0000001f, c = (v16){0} + 1e-7f;
    v16 a0 = b, a1 = a0 + c, a2 = a1 + c, a3 = a2 + c, a4 = a3 + c, a5 = a4 + c;
    v16 a6 = a5 + c, a7 = a6 + c, a8 = a7 + c, a9 = a8 + c, a10 = a9 + c, a11 = a10 + c;
    const long n = 50000000;
    double t0 = now();
    for (long i = 0; i < n; i++) {
        a0 = a0 * b + c; a1 = a1 * b + c; a2 = a2 * b + c; a3 = a3 * b + c;
        a4 = a4 * b + c; a5 = a5 * b + c; a6 = a6 * b + c; a7 = a7 * b + c;
        a8 = a8 * b + c; a9 = a9 * b + c; a10 = a10 * b + c; a11 = a11 * b + c;
    }
    double t = now() - t0;
    v16 s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    /* The sum keeps the chains alive; it never equals the sentinel. */
    *(double *)out = n * 12.0 * 16 * 2 / t / 1e9 + (s[0] == 12345.f);
    return NULL;
}

static double read_gbps(const float *p, size_t n) {
    v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    const v16 *v = (const v16 *)p;
    double t0 = now();
    for (size_t i = 0; i < n / 16; i += 4) {
        a0 += v[i];
        a1 += v[i + 1];
        a2 += v[i + 2];
        a3 += v[i + 3];
    }
    double t = now() - t0;
    volatile float sink = (a0 + a1 + a2 + a3)[0];
    (void)sink;
    return n * 4.0 / t / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "fma")) {
        int nt = argc > 2 ? atoi(argv[2]) : 1;
        if (nt < 1 || nt > 64) return 2;
        pthread_t th[64];
        double r[64], total = 0;
        for (int i = 0; i < nt; i++) pthread_create(&th[i], NULL, fma_thread, &r[i]);
        for (int i = 0; i < nt; i++) pthread_join(th[i], NULL), total += r[i];
        printf("fma threads=%d gflops_total=%.1f gflops_each=%.1f\n", nt, total, total / nt);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "bw")) {
        const size_t bytes = (size_t)1 << 30, n = bytes / 4;
        const int rounds = 7;
        double med[2];
        for (int b = 0; b < 2; b++) {
            float *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) return 1;
            madvise(p, bytes, MADV_HUGEPAGE);
            memset(p, 1, bytes);
            double r[rounds];
            for (int k = 0; k < rounds; k++) r[k] = read_gbps(p, n);
            qsort(r, rounds, sizeof r[0], cmp);
            med[b] = r[rounds / 2];
            munmap(p, bytes);
        }
        printf("bw buffer_gbps=%.1f,%.1f\n", med[0], med[1]);
        return 0;
    }
    fprintf(stderr, "usage: host_probe fma N | host_probe bw\n");
    return 2;
}

// cma_pair.c: the floor of a 2-process exchange by process_vm_readv, the
// single copy that tutti's Send/Recv (from 128 KiB on shared memory) and
// Open MPI's vader (CMA) both use for large messages.
//
// Two processes (a fork), each with a send and a receive buffer of SIZE
// bytes, exchange both ways at once: in each iteration both pass a barrier,
// each reads the other's send buffer into its own receive buffer with
// process_vm_readv (one call, or calls of CHUNK bytes), and both pass a
// second barrier. Prints the median time per exchange over the iterations,
// like `tutti perf send_recv -n 2` and `MPI_Sendrecv` (bench/mpi_perf.sh).
//
//   gcc -O2 -o /tmp/cma_pair bench/peers/cma_pair.c
//   /tmp/cma_pair [ITERS] [CHUNK]      (CHUNK 0: one call per exchange)
//
// The barriers are two counters in a shared anonymous mapping, spun on:
// the probe measures the copy and the kernel's page pinning, not waking.
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
    _Atomic uint64_t arrived[2];
    uint64_t addr[2];
    pid_t pid[2];
};

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

// Both sides reach generation `g` (or, after 10 s, the probe gives up:
// the other side died).
static void barrier(struct shared *s, int me, uint64_t g) {
    atomic_store_explicit(&s->arrived[me], g, memory_order_release);
    double t0 = 0;
    for (uint64_t k = 0; atomic_load_explicit(&s->arrived[1 - me], memory_order_acquire) < g; k++) {
        __builtin_ia32_pause();
        if ((k & 0xfffff) == 0) {
            if (t0 == 0)
                t0 = now_us();
            else if (now_us() - t0 > 10e6) {
                fprintf(stderr, "cma_pair: the other process is gone\n");
                exit(1);
            }
        }
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run(struct shared *s, int me, size_t size, int iters, size_t chunk, uint64_t *gen) {
    char *src = malloc(size), *dst = malloc(size);
    memset(src, me + 1, size);
    memset(dst, 0, size);
    s->addr[me] = (uint64_t)(uintptr_t)src;
    barrier(s, me, ++*gen);
    pid_t peer = s->pid[1 - me];
    uint64_t from = s->addr[1 - me];
    double *t = malloc(sizeof(double) * iters);
    size_t step = chunk ? chunk : size;
    for (int i = -iters / 10 - 1; i < iters; i++) {
        barrier(s, me, ++*gen);
        double t0 = now_us();
        for (size_t off = 0; off < size; off += step) {
            size_t k = size - off < step ? size - off : step;
            struct iovec l = {dst + off, k}, r = {(void *)(uintptr_t)(from + off), k};
            if (process_vm_readv(peer, &l, 1, &r, 1, 0) != (ssize_t)k) {
                perror("process_vm_readv");
                exit(1);
            }
        }
        barrier(s, me, ++*gen);
        if (i >= 0)
            t[i] = now_us() - t0;
    }
    if (dst[size - 1] != 2 - me) {
        fprintf(stderr, "wrong data\n");
        exit(1);
    }
    if (me == 0) {
        qsort(t, iters, sizeof(double), cmp);
        printf("%12zu %10.2f %10.2f\n", size, t[iters / 2], size / t[iters / 2] / 1e3);
        fflush(stdout);
    }
    barrier(s, me, ++*gen);
    free(t);
    free(src);
    free(dst);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 200;
    size_t chunk = argc > 2 ? strtoull(argv[2], 0, 0) : 0;
    struct shared *s = mmap(0, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(s, 0, sizeof *s);
    s->pid[0] = getpid();
    pid_t child = fork();
    int me = child == 0;
    if (me) {
        // Dies with its parent (a parent killed by a closed pipe, say).
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        s->pid[1] = getpid();
    }
    uint64_t gen = 0;
    barrier(s, me, ++gen);
    if (me == 0)
        printf("# process_vm_readv exchange, 2 processes, chunk %zu (0: one call)\n"
               "#       size     us/exch   GB/s each way\n", chunk);
    for (size_t size = 256 << 10; size <= (size_t)256 << 20; size *= 2)
        run(s, me, size, size >= (64u << 20) ? iters / 10 + 5 : iters, chunk, &gen);
    if (me)
        return 0;
    waitpid(child, 0, 0);
    return 0;
}

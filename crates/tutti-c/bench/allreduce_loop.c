/* The C side of the ABI overhead benchmark (scripts/bench_overhead.sh): a
 * loop of small AllReduces through libtutti, timed like
 * examples/allreduce_loop.rs does through the Rust API.
 * `tutti run -n 2 -- allreduce_loop [ITERS] [BYTES]` prints, on rank 0,
 * `c us_per_op <t>`. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <tutti.h>

#define CHECK(x)                                                           \
  do {                                                                     \
    if ((x) != tuttiSuccess) {                                             \
      fprintf(stderr, "%s: %s\n", #x, tuttiGetLastError(NULL));            \
      return 1;                                                            \
    }                                                                      \
  } while (0)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  long iters = argc > 1 ? atol(argv[1]) : 50000;
  size_t count = (argc > 2 ? (size_t)atol(argv[2]) : 8) / sizeof(float);
  tuttiComm_t comm;
  CHECK(tuttiCommInitFromEnv(&comm, NULL));
  float *buf = malloc(count * sizeof(float) + 1);
  for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
  for (long i = 0; i < iters / 10 + 1000; i++)
    CHECK(tuttiAllReduce(buf, buf, count, tuttiFloat32, tuttiSum, comm, NULL));
  CHECK(tuttiBarrier(comm, NULL));
  /* The median of BLOCKS timed blocks, so that a block in which another
   * process took the core (a shared 2-core machine) does not decide it. */
  enum { BLOCKS = 20 };
  double blocks[BLOCKS];
  for (int b = 0; b < BLOCKS; b++) {
    double t = now();
    for (long i = 0; i < iters / BLOCKS; i++)
      CHECK(tuttiAllReduce(buf, buf, count, tuttiFloat32, tuttiSum, comm, NULL));
    blocks[b] = (now() - t) * 1e6 / (iters / BLOCKS);
  }
  qsort(blocks, BLOCKS, sizeof blocks[0], cmp);
  double us = blocks[BLOCKS / 2];
  CHECK(tuttiBarrier(comm, NULL));
  int me;
  CHECK(tuttiCommUserRank(comm, &me));
  if (me == 0) printf("c us_per_op %.4f\n", us);
  CHECK(tuttiCommDestroy(comm));
  free(buf);
  return 0;
}

/*
 * mpi_perf.c: the MPI calls the peer kit's coll_perf.c (../shared/peers) does
 * not measure, timed its way, so that bench/compare.sh can put tutti's next to
 * MPI's:
 *   -c reduce    MPI_Reduce, float32 sum, root 0
 *   -c sendrecv  MPI_Sendrecv: every rank sends to rank+1 and receives from
 *                rank-1 at once (nccl-tests' sendrecv, tutti perf send_recv)
 *
 * size    = bytes of each rank's buffer (nccl-tests' convention)
 * time_us = mean time per call over the timed calls, maximum over ranks; the
 *           number of timed calls comes from one probe call after warm-up,
 *           clamped to [MINITERS, MAXITERS] and agreed with MPI_MAX
 * busbw   = algbw = size / time (nccl-tests' factor is 1 for both)
 * check   = after timing, one call on rank-dependent small integers, compared
 *           exactly (on the root for reduce, on every rank for sendrecv; -n
 *           skips it)
 *
 * Usage: mpi_perf [-c reduce|sendrecv] [-b MIN] [-e MAX] [-t SECONDS] [-l LABEL]
 *                 [-o OUT.csv] [-n]
 *        sizes take K/M/G suffixes (powers of 1024), doubling from MIN to MAX.
 * Build: mpicc.openmpi -O2 -Wall -o mpi_perf.openmpi mpi_perf.c
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WARMUP 5
#define MINITERS 5
#define MAXITERS 100000

static int sendrecv; /* -c sendrecv, else reduce */
static int rank, n;

/* One call of the measured collective on COUNT floats. */
static void call(const float *sbuf, float *rbuf, size_t count) {
  if (sendrecv)
    MPI_Sendrecv(sbuf, (int)count, MPI_FLOAT, (rank + 1) % n, 0, rbuf, (int)count, MPI_FLOAT,
                 (rank + n - 1) % n, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  else
    MPI_Reduce(sbuf, rbuf, (int)count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
}

static size_t parse_bytes(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024.0;
  else if (*end == 'M' || *end == 'm') v *= 1024.0 * 1024.0;
  else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024.0 * 1024.0;
  return (size_t)v;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t minb = 8, maxb = 256u << 20;
  double target = 0.15;
  const char *label = "mpi", *out = NULL;
  int check = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-b") && i + 1 < argc) minb = parse_bytes(argv[++i]);
    else if (!strcmp(argv[i], "-e") && i + 1 < argc) maxb = parse_bytes(argv[++i]);
    else if (!strcmp(argv[i], "-t") && i + 1 < argc) target = atof(argv[++i]);
    else if (!strcmp(argv[i], "-l") && i + 1 < argc) label = argv[++i];
    else if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "-n")) check = 0;
    else if (!strcmp(argv[i], "-c") && i + 1 < argc) {
      const char *c = argv[++i];
      if (!strcmp(c, "sendrecv") || !strcmp(c, "send_recv")) sendrecv = 1;
      else if (!strcmp(c, "reduce")) sendrecv = 0;
      else {
        if (rank == 0) fprintf(stderr, "mpi_perf: -c must be reduce or sendrecv, not %s\n", c);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    } else {
      if (rank == 0) fprintf(stderr, "mpi_perf: unknown argument %s\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (minb < 4) minb = 4;
  size_t maxcount = maxb / 4 ? maxb / 4 : 1;
  float *sbuf = malloc(maxcount * sizeof(float)), *rbuf = malloc(maxcount * sizeof(float));
  if (!sbuf || !rbuf) {
    fprintf(stderr, "mpi_perf: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < maxcount; i++) sbuf[i] = 1.0f, rbuf[i] = 0.0f;
  const char *coll = sendrecv ? "sendrecv" : "reduce";
  FILE *csv = NULL;
  if (rank == 0) {
    char host[256] = "?";
    gethostname(host, sizeof host);
    printf("# mpi_perf: coll=%s nranks=%d host=%s label=%s target=%.3fs min=%zu max=%zu\n", coll,
           n, host, label, target, minb, maxb);
    printf("%12s %12s %7s %12s %10s %10s %6s\n", "size(B)", "count", "iters", "time(us)", "algbw",
           "busbw", "check");
    if (out) {
      csv = fopen(out, "w");
      if (!csv) {
        perror(out);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      fprintf(csv, "label,coll,nranks,size_bytes,count,iters,time_us,algbw_GBps,busbw_GBps,check\n");
    }
  }
  for (size_t bytes = minb; bytes <= maxb; bytes *= 2) {
    size_t count = bytes / 4;
    size_t size = count * 4;
    for (int i = 0; i < WARMUP; i++)
      call(sbuf, rbuf, count);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    call(sbuf, rbuf, count);
    double probe = MPI_Wtime() - t0, pmax;
    MPI_Allreduce(&probe, &pmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long iters = pmax > 0 ? (long)(target / pmax) : MAXITERS;
    if (iters < MINITERS) iters = MINITERS;
    if (iters > MAXITERS) iters = MAXITERS;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++) call(sbuf, rbuf, count);
    double t = (MPI_Wtime() - t0) / (double)iters, tmax;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const char *ck = "skip";
    if (check) {
      for (size_t i = 0; i < count; i++) sbuf[i] = (float)((rank + 1) * (int)(i % 7 + 1));
      call(sbuf, rbuf, count);
      long bad = 0;
      if (sendrecv) {
        int from = (rank + n - 1) % n;
        for (size_t i = 0; i < count; i++)
          if (rbuf[i] != (float)((from + 1) * (int)(i % 7 + 1))) bad++;
      } else if (rank == 0) {
        float ranks = (float)n * (float)(n + 1) / 2.0f;
        for (size_t i = 0; i < count; i++)
          if (rbuf[i] != ranks * (float)(i % 7 + 1)) bad++;
      }
      long anybad = 0;
      MPI_Allreduce(&bad, &anybad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
      ck = anybad ? "FAIL" : "ok";
      for (size_t i = 0; i < count; i++) sbuf[i] = 1.0f;
    }
    if (rank == 0) {
      double algbw = (double)size / tmax / 1e9;
      printf("%12zu %12zu %7ld %12.2f %10.3f %10.3f %6s\n", size, count, iters, tmax * 1e6, algbw,
             algbw, ck);
      if (csv)
        fprintf(csv, "%s,%s,%d,%zu,%zu,%ld,%.3f,%.4f,%.4f,%s\n", label, coll, n, size, count, iters,
                tmax * 1e6, algbw, algbw, ck);
    }
    if (bytes > maxb / 2) break;
  }
  if (csv) fclose(csv);
  free(sbuf);
  free(rbuf);
  MPI_Finalize();
  return 0;
}

/* Written only against nccl_compat.h, in NCCL's style: rank 0's unique id
 * shared through a file (argv[1]; NCCL programs often use MPI),
 * ncclCommInitRank, collectives on a stream inside a group, a ring of
 * ncclSend/ncclRecv in a group, then one process driving several
 * communicators (ncclCommInitAll) from one thread through a group. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl_compat.h>

#define NCCLCHECK(call)                                                       \
  do {                                                                        \
    ncclResult_t r_ = (call);                                                 \
    if (r_ != ncclSuccess) {                                                  \
      fprintf(stderr, "%s failed: %s: %s\n", #call, ncclGetErrorString(r_),   \
              ncclGetLastError(NULL));                                        \
      return 1;                                                               \
    }                                                                         \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 2 || !getenv("RANK") || !getenv("WORLD_SIZE")) return 2;
  int rank = atoi(getenv("RANK")), size = atoi(getenv("WORLD_SIZE"));
  ncclUniqueId id;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
  if (rank == 0) {
    NCCLCHECK(ncclGetUniqueId(&id));
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, argv[1])) return 3;
  } else {
    FILE *f = NULL;
    for (int i = 0; i < 60000 && !(f = fopen(argv[1], "rb")); i++) usleep(1000);
    if (!f || fread(&id, sizeof id, 1, f) != 1) return 4;
    fclose(f);
  }
  ncclComm_t comm;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  NCCLCHECK(ncclCommInitRankConfig(&comm, size, id, rank, &config));
  cudaStream_t s;
  if (cudaStreamCreate(&s) != cudaSuccess) return 5;
  enum { N = 4096 };
  float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
  int *out = malloc(N * sizeof(int)), *in = malloc(N * sizeof(int));
  for (int i = 0; i < N; i++) a[i] = (float)(rank + 1), out[i] = rank;
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclAllReduce(a, b, N, ncclFloat, ncclSum, comm, s));
  NCCLCHECK(ncclSend(out, N, ncclInt, (rank + 1) % size, comm, s));
  NCCLCHECK(ncclRecv(in, N, ncclInt, (rank + size - 1) % size, comm, s));
  NCCLCHECK(ncclGroupEnd());
  if (cudaStreamSynchronize(s) != cudaSuccess) return 6;
  for (int i = 0; i < N; i++)
    if (b[i] != (float)(size * (size + 1) / 2) || in[i] != (rank + size - 1) % size) return 7;
  ncclResult_t async;
  NCCLCHECK(ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) return 8;
  if (cudaStreamDestroy(s) != cudaSuccess) return 9;
  NCCLCHECK(ncclCommDestroy(comm));

  /* One thread, several communicators: NCCL's single-process pattern. */
  enum { DEVS = 3 };
  ncclComm_t comms[DEVS];
  float x[DEVS][8];
  NCCLCHECK(ncclCommInitAll(comms, DEVS, NULL));
  NCCLCHECK(ncclGroupStart());
  for (int d = 0; d < DEVS; d++) {
    for (int i = 0; i < 8; i++) x[d][i] = (float)d;
    NCCLCHECK(ncclAllReduce(x[d], x[d], 8, ncclFloat, ncclMax, comms[d], NULL));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int d = 0; d < DEVS; d++) {
    if (x[d][7] != (float)(DEVS - 1)) return 10;
    NCCLCHECK(ncclCommDestroy(comms[d]));
  }
  free(a);
  free(b);
  free(out);
  free(in);
  printf("OK nccl %d/%d\n", rank, size);
  return 0;
}

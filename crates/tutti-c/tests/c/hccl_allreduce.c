/* Written only against hccl_compat.h, in HCCL's style: rank 0 makes the
 * root info and shares it (here through a file named by argv[1]; HCCL
 * programs often use MPI), every rank joins with HcclCommInitRootInfo and
 * runs an AllReduce loop on a stream. Rank and size come from RANK and
 * WORLD_SIZE (set by `tutti run`, torchrun and others). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hccl_compat.h>

#define HCCLCHECK(call)                                                     \
  do {                                                                      \
    HcclResult r_ = (call);                                                 \
    if (r_ != HCCL_SUCCESS) {                                               \
      fprintf(stderr, "%s failed: %d %s\n", #call, r_, HcclGetErrorString(r_)); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 2 || !getenv("RANK") || !getenv("WORLD_SIZE")) {
    fprintf(stderr, "usage: RANK=.. WORLD_SIZE=.. %s ROOTINFO_FILE\n", argv[0]);
    return 2;
  }
  uint32_t rank = (uint32_t)atoi(getenv("RANK")), size = (uint32_t)atoi(getenv("WORLD_SIZE"));
  HcclRootInfo info;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
  if (rank == 0) {
    HCCLCHECK(HcclGetRootInfo(&info));
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(&info, sizeof info, 1, f) != 1 || fclose(f) != 0) return 3;
    if (rename(tmp, argv[1]) != 0) return 3;
  } else {
    FILE *f = NULL;
    for (int i = 0; i < 60000 && !(f = fopen(argv[1], "rb")); i++) usleep(1000);
    if (!f || fread(&info, sizeof info, 1, f) != 1) return 4;
    fclose(f);
  }
  HcclComm comm;
  HCCLCHECK(HcclCommInitRootInfo(size, &info, rank, &comm));
  uint32_t n = 0, me = 0;
  HCCLCHECK(HcclGetRankSize(comm, &n));
  HCCLCHECK(HcclGetRankId(comm, &me));
  if (n != size || me != rank) return 5;
  aclrtStream stream;
  if (aclrtCreateStream(&stream) != ACL_SUCCESS) return 6;
  enum { COUNT = 1000 };
  float *send = malloc(COUNT * sizeof(float)), *recv = malloc(COUNT * sizeof(float));
  for (int step = 0; step < 20; step++) {
    for (int i = 0; i < COUNT; i++) send[i] = (float)(me + step + i % 10);
    HCCLCHECK(HcclAllReduce(send, recv, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream));
    if (aclrtSynchronizeStream(stream) != ACL_SUCCESS) return 7;
    for (int i = 0; i < COUNT; i++) {
      float want = (float)(n * (n - 1) / 2 + n * (step + i % 10));
      if (recv[i] != want) {
        fprintf(stderr, "step %d [%d] = %g, want %g\n", step, i, recv[i], want);
        return 8;
      }
    }
  }
  int32_t v = (int32_t)me;
  HCCLCHECK(HcclBroadcast(&v, 1, HCCL_DATA_TYPE_INT32, n - 1, comm, NULL));
  if (v != (int32_t)(n - 1)) return 9;
  HCCLCHECK(HcclBarrier(comm, stream));
  if (aclrtSynchronizeStream(stream) != ACL_SUCCESS || aclrtDestroyStream(stream) != ACL_SUCCESS) return 10;
  HCCLCHECK(HcclCommDestroy(comm));
  free(send);
  free(recv);
  printf("OK hccl %u/%u\n", me, n);
  return 0;
}

/* nccl_compat.h: NCCL's names on top of tutti.h, so that a program
 * written for NCCL compiles against libtutti with an include path:
 *   #include <nccl_compat.h>   (instead of <nccl.h>)
 * cudaStream_t is tutti's queue (tuttiQueue_t), and the stream calls a
 * CPU program needs (create, synchronize, query, destroy) map onto the
 * queue's. Device memory, CUDA graphs, user reduction operators and
 * buffer registration have no CPU meaning and are not provided: see
 * docs/c.md for the full table. */
#ifndef TUTTI_NCCL_COMPAT_H
#define TUTTI_NCCL_COMPAT_H

#include "tutti.h"

typedef tuttiComm_t ncclComm_t;
typedef tuttiResult_t ncclResult_t;
typedef tuttiDataType_t ncclDataType_t;
typedef tuttiRedOp_t ncclRedOp_t;
typedef tuttiUniqueId ncclUniqueId;
typedef tuttiConfig_t ncclConfig_t;
typedef tuttiQueue_t cudaStream_t;
typedef int cudaError_t;

#define NCCL_MAJOR TUTTI_MAJOR
#define NCCL_MINOR TUTTI_MINOR
#define NCCL_PATCH TUTTI_PATCH
#define NCCL_VERSION_CODE TUTTI_VERSION_CODE
#define NCCL_UNIQUE_ID_BYTES TUTTI_UNIQUE_ID_BYTES
#define NCCL_SPLIT_NOCOLOR TUTTI_SPLIT_NOCOLOR
#define NCCL_SHRINK_DEFAULT TUTTI_SHRINK_DEFAULT
#define NCCL_SHRINK_ABORT TUTTI_SHRINK_ABORT
#define NCCL_CONFIG_INITIALIZER TUTTI_CONFIG_INITIALIZER

#define ncclSuccess tuttiSuccess
#define ncclUnhandledCudaError 1
#define ncclSystemError tuttiSystemError
#define ncclInternalError tuttiInternalError
#define ncclInvalidArgument tuttiInvalidArgument
#define ncclInvalidUsage tuttiInvalidUsage
#define ncclRemoteError tuttiRemoteError
#define ncclInProgress tuttiInProgress
#define ncclNumResults tuttiNumResults

#define ncclInt8 tuttiInt8
#define ncclChar tuttiChar
#define ncclUint8 tuttiUint8
#define ncclInt32 tuttiInt32
#define ncclInt tuttiInt
#define ncclUint32 tuttiUint32
#define ncclInt64 tuttiInt64
#define ncclUint64 tuttiUint64
#define ncclFloat16 tuttiFloat16
#define ncclHalf tuttiHalf
#define ncclFloat32 tuttiFloat32
#define ncclFloat tuttiFloat
#define ncclFloat64 tuttiFloat64
#define ncclDouble tuttiDouble
#define ncclBfloat16 tuttiBfloat16
#define ncclNumTypes tuttiNumTypes

#define ncclSum tuttiSum
#define ncclProd tuttiProd
#define ncclMax tuttiMax
#define ncclMin tuttiMin
#define ncclAvg tuttiAvg
#define ncclNumOps tuttiNumOps

#define cudaSuccess 0

static inline ncclResult_t ncclGetVersion(int *version) { return tuttiGetVersion(version); }
static inline const char *ncclGetErrorString(ncclResult_t r) { return tuttiGetErrorString(r); }
static inline const char *ncclGetLastError(ncclComm_t comm) { return tuttiGetLastError(comm); }
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { return tuttiGetUniqueId(id); }
static inline ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return tuttiCommInitRank(comm, nranks, id, rank);
}
static inline ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                                  int rank, ncclConfig_t *config) {
  return tuttiCommInitRankConfig(comm, nranks, id, rank, config);
}
static inline ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  return tuttiCommInitAll(comms, ndev, devlist);
}
static inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                         ncclConfig_t *config) {
  return tuttiCommSplit(comm, color, key, newcomm, config);
}
static inline ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList,
                                          int excludeRanksCount, ncclComm_t *newcomm,
                                          ncclConfig_t *config, int shrinkFlags) {
  return tuttiCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
}
static inline ncclResult_t ncclCommFinalize(ncclComm_t comm) { return tuttiCommFinalize(comm); }
static inline ncclResult_t ncclCommDestroy(ncclComm_t comm) { return tuttiCommDestroy(comm); }
/* Unlike NCCL's, abort frees nothing (so it is safe while other threads'
 * calls on comm run): ncclCommDestroy frees the handle afterwards. */
static inline ncclResult_t ncclCommAbort(ncclComm_t comm) { return tuttiCommAbort(comm); }
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *e) {
  return tuttiCommGetAsyncError(comm, e);
}
static inline ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  return tuttiCommCount(comm, count);
}
/* There are no devices: every rank is "device" 0. */
static inline ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  int n;
  ncclResult_t r = tuttiCommCount(comm, &n);
  if (r == ncclSuccess && device) *device = 0;
  return device ? r : ncclInvalidArgument;
}
static inline ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  return tuttiCommUserRank(comm, rank);
}
static inline ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  return tuttiAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}
static inline ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                         ncclDataType_t datatype, int root, ncclComm_t comm,
                                         cudaStream_t stream) {
  return tuttiBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
}
static inline ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                                     ncclComm_t comm, cudaStream_t stream) {
  return tuttiBcast(buff, count, datatype, root, comm, stream);
}
static inline ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, int root,
                                      ncclComm_t comm, cudaStream_t stream) {
  return tuttiReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}
static inline ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm,
                                         cudaStream_t stream) {
  return tuttiAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}
static inline ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff,
                                             size_t recvcount, ncclDataType_t datatype,
                                             ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream) {
  return tuttiReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}
static inline ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t stream) {
  return tuttiAllToAll(sendbuff, recvbuff, count, datatype, comm, stream);
}
static inline ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
  return tuttiGather(sendbuff, recvbuff, sendcount, datatype, root, comm, stream);
}
static inline ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  return tuttiScatter(sendbuff, recvbuff, recvcount, datatype, root, comm, stream);
}
static inline ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                                    int peer, ncclComm_t comm, cudaStream_t stream) {
  return tuttiSend(sendbuff, count, datatype, peer, comm, stream);
}
static inline ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype,
                                    int peer, ncclComm_t comm, cudaStream_t stream) {
  return tuttiRecv(recvbuff, count, datatype, peer, comm, stream);
}
static inline ncclResult_t ncclGroupStart(void) { return tuttiGroupStart(); }
static inline ncclResult_t ncclGroupEnd(void) { return tuttiGroupEnd(); }

/* The stream calls, on tutti's queues (cudaError_t: 0 is success). */
static inline cudaError_t cudaStreamCreate(cudaStream_t *stream) { return tuttiQueueCreate(stream); }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return tuttiQueueSynchronize(stream);
}
static inline cudaError_t cudaStreamQuery(cudaStream_t stream) { return tuttiQueueQuery(stream); }
static inline cudaError_t cudaStreamDestroy(cudaStream_t stream) { return tuttiQueueDestroy(stream); }

#endif

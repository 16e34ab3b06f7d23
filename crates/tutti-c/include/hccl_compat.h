/* hccl_compat.h: HCCL's names on top of tutti.h, so that a program
 * written for HCCL compiles against libtutti with an include path:
 *   #include <hccl_compat.h>   (instead of <hccl/hccl.h>)
 * aclrtStream is tutti's queue (tuttiQueue_t; NULL blocks). HCCL's own
 * numbers for results, types and operators are kept and translated.
 * docs/c.md lists what maps and what does not. */
#ifndef TUTTI_HCCL_COMPAT_H
#define TUTTI_HCCL_COMPAT_H

#include <stdint.h>

#include "tutti.h"

typedef tuttiComm_t HcclComm;
typedef tuttiQueue_t aclrtStream;
typedef tuttiUniqueId HcclRootInfo;

typedef enum {
  HCCL_SUCCESS = 0,
  HCCL_E_PARA = 1,
  HCCL_E_PTR = 2,
  HCCL_E_MEMORY = 3,
  HCCL_E_INTERNAL = 4,
  HCCL_E_NOT_SUPPORT = 5,
  HCCL_E_NOT_FOUND = 6,
  HCCL_E_UNAVAIL = 7,
  HCCL_E_SYSCALL = 8,
  HCCL_E_TIMEOUT = 9,
  HCCL_E_REMOTE = 21
} HcclResult;

typedef enum {
  HCCL_DATA_TYPE_INT8 = 0,
  HCCL_DATA_TYPE_INT16 = 1,
  HCCL_DATA_TYPE_INT32 = 2,
  HCCL_DATA_TYPE_FP16 = 3,
  HCCL_DATA_TYPE_FP32 = 4,
  HCCL_DATA_TYPE_INT64 = 5,
  HCCL_DATA_TYPE_UINT64 = 6,
  HCCL_DATA_TYPE_UINT8 = 7,
  HCCL_DATA_TYPE_UINT16 = 8,
  HCCL_DATA_TYPE_UINT32 = 9,
  HCCL_DATA_TYPE_FP64 = 10,
  HCCL_DATA_TYPE_BFP16 = 11,
  HCCL_DATA_TYPE_RESERVED
} HcclDataType;

typedef enum {
  HCCL_REDUCE_SUM = 0,
  HCCL_REDUCE_PROD = 1,
  HCCL_REDUCE_MAX = 2,
  HCCL_REDUCE_MIN = 3,
  HCCL_REDUCE_RESERVED
} HcclReduceOp;

#define HCCL_ROOT_INFO_BYTES TUTTI_UNIQUE_ID_BYTES

/* Translations (internal). A type tutti lacks (int16, uint16) becomes an
 * invalid type, so the call fails with HCCL_E_PARA and a message. */
static inline HcclResult tuttiHcclResult_(tuttiResult_t r) {
  switch (r) {
    case tuttiSuccess: return HCCL_SUCCESS;
    case tuttiInvalidArgument: case tuttiInvalidUsage: return HCCL_E_PARA;
    case tuttiSystemError: return HCCL_E_SYSCALL;
    case tuttiTimeout: return HCCL_E_TIMEOUT;
    case tuttiRemoteError: return HCCL_E_REMOTE;
    case tuttiInProgress: return HCCL_E_UNAVAIL;
    default: return HCCL_E_INTERNAL;
  }
}
static inline tuttiDataType_t tuttiHcclType_(HcclDataType t) {
  switch (t) {
    case HCCL_DATA_TYPE_INT8: return tuttiInt8;
    case HCCL_DATA_TYPE_INT32: return tuttiInt32;
    case HCCL_DATA_TYPE_FP16: return tuttiFloat16;
    case HCCL_DATA_TYPE_FP32: return tuttiFloat32;
    case HCCL_DATA_TYPE_INT64: return tuttiInt64;
    case HCCL_DATA_TYPE_UINT64: return tuttiUint64;
    case HCCL_DATA_TYPE_UINT8: return tuttiUint8;
    case HCCL_DATA_TYPE_UINT32: return tuttiUint32;
    case HCCL_DATA_TYPE_FP64: return tuttiFloat64;
    case HCCL_DATA_TYPE_BFP16: return tuttiBfloat16;
    default: return -1;
  }
}
static inline tuttiRedOp_t tuttiHcclOp_(HcclReduceOp op) {
  return (op >= HCCL_REDUCE_SUM && op <= HCCL_REDUCE_MIN) ? (tuttiRedOp_t)op : -1;
}

static inline HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
  return tuttiHcclResult_(tuttiGetUniqueId(rootInfo));
}
static inline HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo,
                                              uint32_t rank, HcclComm *comm) {
  if (rootInfo == NULL) return HCCL_E_PTR;
  return tuttiHcclResult_(tuttiCommInitRank(comm, (int)nRanks, *rootInfo, (int)rank));
}
static inline HcclResult HcclCommDestroy(HcclComm comm) {
  return tuttiHcclResult_(tuttiCommDestroy(comm));
}
static inline HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize) {
  int n = 0;
  tuttiResult_t r = tuttiCommCount(comm, &n);
  if (r == tuttiSuccess && rankSize) *rankSize = (uint32_t)n;
  return rankSize ? tuttiHcclResult_(r) : HCCL_E_PTR;
}
static inline HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank) {
  int me = 0;
  tuttiResult_t r = tuttiCommUserRank(comm, &me);
  if (r == tuttiSuccess && rank) *rank = (uint32_t)me;
  return rank ? tuttiHcclResult_(r) : HCCL_E_PTR;
}
static inline const char *HcclGetErrorString(HcclResult code) {
  return code == HCCL_SUCCESS ? "no error" : tuttiGetLastError(NULL);
}
static inline HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count,
                                       HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                       aclrtStream stream) {
  return tuttiHcclResult_(tuttiAllReduce(sendBuf, recvBuf, (size_t)count, tuttiHcclType_(dataType),
                                         tuttiHcclOp_(op), comm, stream));
}
static inline HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType,
                                       uint32_t root, HcclComm comm, aclrtStream stream) {
  return tuttiHcclResult_(
      tuttiBcast(buf, (size_t)count, tuttiHcclType_(dataType), (int)root, comm, stream));
}
static inline HcclResult HcclReduce(void *sendBuf, void *recvBuf, uint64_t count,
                                    HcclDataType dataType, HcclReduceOp op, uint32_t root,
                                    HcclComm comm, aclrtStream stream) {
  return tuttiHcclResult_(tuttiReduce(sendBuf, recvBuf, (size_t)count, tuttiHcclType_(dataType),
                                      tuttiHcclOp_(op), (int)root, comm, stream));
}
static inline HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount,
                                       HcclDataType dataType, HcclComm comm, aclrtStream stream) {
  return tuttiHcclResult_(tuttiAllGather(sendBuf, recvBuf, (size_t)sendCount,
                                         tuttiHcclType_(dataType), comm, stream));
}
static inline HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount,
                                           HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                           aclrtStream stream) {
  return tuttiHcclResult_(tuttiReduceScatter(sendBuf, recvBuf, (size_t)recvCount,
                                             tuttiHcclType_(dataType), tuttiHcclOp_(op), comm,
                                             stream));
}
static inline HcclResult HcclBarrier(HcclComm comm, aclrtStream stream) {
  return tuttiHcclResult_(tuttiBarrier(comm, stream));
}
static inline HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType,
                                  uint32_t destRank, HcclComm comm, aclrtStream stream) {
  return tuttiHcclResult_(
      tuttiSend(sendBuf, (size_t)count, tuttiHcclType_(dataType), (int)destRank, comm, stream));
}
static inline HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType,
                                  uint32_t srcRank, HcclComm comm, aclrtStream stream) {
  return tuttiHcclResult_(
      tuttiRecv(recvBuf, (size_t)count, tuttiHcclType_(dataType), (int)srcRank, comm, stream));
}

/* The stream calls a CPU program needs, on tutti's queues (0: success). */
typedef int aclError;
#define ACL_SUCCESS 0
static inline aclError aclrtCreateStream(aclrtStream *stream) { return tuttiQueueCreate(stream); }
static inline aclError aclrtSynchronizeStream(aclrtStream stream) {
  return tuttiQueueSynchronize(stream);
}
static inline aclError aclrtDestroyStream(aclrtStream stream) { return tuttiQueueDestroy(stream); }

#endif

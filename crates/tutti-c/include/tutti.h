/* tutti.h: the C API of tutti (libtutti), shaped like NCCL's.
 * Generated from crates/tutti-c/src by cbindgen; do not edit (see docs/c.md). */

#ifndef TUTTI_H
#define TUTTI_H

#include <stddef.h>
#include <stdint.h>

// The major version.
#define TUTTI_MAJOR 0

// The minor version.
#define TUTTI_MINOR 1

// The patch level.
#define TUTTI_PATCH 0

// `MAJOR * 10000 + MINOR * 100 + PATCH`, as [`tuttiGetVersion`] returns it.
#define TUTTI_VERSION_CODE (((TUTTI_MAJOR * 10000) + (TUTTI_MINOR * 100)) + TUTTI_PATCH)

// The size of a [`tuttiUniqueId`].
#define TUTTI_UNIQUE_ID_BYTES 128

// Pass as `color` to [`tuttiCommSplit`] to get no new communicator.
#define TUTTI_SPLIT_NOCOLOR -1

// Marks an initialized [`tuttiConfig_t`].
#define TUTTI_CONFIG_MAGIC 1953854580

// No flags: the survivors build the new communicator.
#define TUTTI_SHRINK_DEFAULT 0

// Abort `comm`'s pending operations first.
#define TUTTI_SHRINK_ABORT 1

// A communicator (opaque): one rank's membership of a group.
typedef struct tuttiComm tuttiComm;

// A queue of operations (opaque).
typedef struct tuttiQueue tuttiQueue;

// The result of every call: `tuttiSuccess` (0) or an error code. The
// numbers are NCCL's (`ncclResult_t`) where the meaning is the same.
typedef int tuttiResult_t;

// Element types; the numbers are NCCL's (`ncclDataType_t`).
typedef int tuttiDataType_t;

// Reductions; the numbers are NCCL's (`ncclRedOp_t`).
typedef int tuttiRedOp_t;

// The handle of a communicator.
typedef struct tuttiComm *tuttiComm_t;

// The handle of a queue; NULL in a data call means "block until done".
typedef struct tuttiQueue *tuttiQueue_t;

// What lets ranks find each other: made by [`tuttiGetUniqueId`] on one
// rank and passed to the others by any means (its bytes may be copied).
// It holds a NUL-terminated text (`tutti1:ADDR:PORT:TOKEN`).
typedef struct tuttiUniqueId {
  // The text, NUL-terminated.
  char internal[TUTTI_UNIQUE_ID_BYTES];
} tuttiUniqueId;

// Algorithms a [`tuttiConfig_t`] may force for every collective that has
// them (others keep the tuner's choice).
typedef int tuttiAlgo_t;

// Options for a new communicator, like `ncclConfig_t`. Initialize it with
// `TUTTI_CONFIG_INITIALIZER`: `size`, `magic` and `version` let the struct
// grow, as fields the library does not know of (or an older caller did not
// have) are never read.
typedef struct tuttiConfig_t {
  // `sizeof(tuttiConfig_t)` as the caller compiled it.
  size_t size;
  // [`TUTTI_CONFIG_MAGIC`].
  uint32_t magic;
  // [`TUTTI_VERSION_CODE`] as the caller compiled it.
  uint32_t version;
  // The deadline of every operation, in milliseconds (0: `TUTTI_TIMEOUT`).
  int64_t timeoutMs;
  // An algorithm to force ([`tuttiAlgoAuto`]: the tuner decides).
  tuttiAlgo_t algorithm;
  // The type float32 gradients travel as between ranks:
  // [`tuttiBfloat16`] or [`tuttiFloat16`] for a 16-bit wire, which
  // halves the bytes and still adds in float32 at every hop (docs/training.md);
  // [`TUTTI_WIRE_NATIVE`] (the default): every call moves its own type.
  // It applies to the float32 `tuttiSum`/`tuttiAvg` AllReduce,
  // ReduceScatter and Reduce of this communicator; its other calls run
  // as they would without it.
  tuttiDataType_t wireType;
} tuttiConfig_t;

// The call succeeded.
#define tuttiSuccess 0

// An operating-system call failed (a socket, shared memory, a thread).
#define tuttiSystemError 2

// A bug in tutti (a panic, caught at the ABI boundary).
#define tuttiInternalError 3

// An argument is wrong: a NULL pointer, a count, a type, a root or peer.
#define tuttiInvalidArgument 4

// The calls are wrong together: ranks called different collectives, a
// configuration is invalid, group calls do not nest.
#define tuttiInvalidUsage 5

// A peer failed: its process died or its connection broke.
#define tuttiRemoteError 6

// The operation has not completed yet (`tuttiQueueQuery`).
#define tuttiInProgress 7

// An operation did not complete within its deadline.
#define tuttiTimeout 8

// The communicator was aborted.
#define tuttiAborted 9

// One past the largest result code.
#define tuttiNumResults 10

// Signed 8-bit integer.
#define tuttiInt8 0

// Signed 8-bit integer (NCCL's alias).
#define tuttiChar 0

// Unsigned 8-bit integer.
#define tuttiUint8 1

// Signed 32-bit integer.
#define tuttiInt32 2

// Signed 32-bit integer (NCCL's alias).
#define tuttiInt 2

// Unsigned 32-bit integer.
#define tuttiUint32 3

// Signed 64-bit integer.
#define tuttiInt64 4

// Unsigned 64-bit integer.
#define tuttiUint64 5

// IEEE half precision.
#define tuttiFloat16 6

// IEEE half precision (NCCL's alias).
#define tuttiHalf 6

// 32-bit float.
#define tuttiFloat32 7

// 32-bit float (NCCL's alias).
#define tuttiFloat 7

// 64-bit float.
#define tuttiFloat64 8

// 64-bit float (NCCL's alias).
#define tuttiDouble 8

// bfloat16.
#define tuttiBfloat16 9

// One past the largest data type.
#define tuttiNumTypes 10

// Sum (integers wrap).
#define tuttiSum 0

// Product (integers wrap).
#define tuttiProd 1

// Maximum.
#define tuttiMax 2

// Minimum.
#define tuttiMin 3

// Average: the sum divided by the number of ranks (integers truncate).
#define tuttiAvg 4

// One past the largest reduction.
#define tuttiNumOps 5

// The tuner picks per call (or `TUTTI_ALGO`).
#define tuttiAlgoAuto 0

// Ring.
#define tuttiAlgoRing 1

// Binomial / binary trees.
#define tuttiAlgoTree 2

// Two complementary binary trees.
#define tuttiAlgoDoubleTree 3

// Recursive halving and doubling.
#define tuttiAlgoHalvingDoubling 4

// One shot: every rank talks to every rank.
#define tuttiAlgoDirect 5

// Pairwise exchange (AllToAll).
#define tuttiAlgoPairwise 6

// Direct reduce-scatter then all-gather.
#define tuttiAlgoTwoShot 7

// [`tuttiConfig_t::wireType`]'s default: data travels as its own type.
#define TUTTI_WIRE_NATIVE -1

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Writes the library's version, [`TUTTI_VERSION_CODE`], to `*version`.
//
// # Safety
// `version` must be NULL or valid for a write of an `int`.
tuttiResult_t tuttiGetVersion(int *version);

// Reduces `count` elements of every rank's `sendbuff` with `op` into every
// rank's `recvbuff`. In place: `sendbuff == recvbuff`.
//
// # Safety
// `sendbuff`/`recvbuff` valid for `count` elements each, untouched until
// the call completes (at once with a NULL queue, else per the queue);
// `comm` and `queue` live handles (queue may be NULL).
tuttiResult_t tuttiAllReduce(const void *sendbuff,
                             void *recvbuff,
                             size_t count,
                             tuttiDataType_t datatype,
                             tuttiRedOp_t op,
                             tuttiComm_t comm,
                             tuttiQueue_t queue);

// Copies `count` elements of the root's `sendbuff` into every rank's
// `recvbuff`. `sendbuff` is read on the root only; in place:
// `sendbuff == recvbuff`.
//
// # Safety
// As for [`tuttiAllReduce`].
tuttiResult_t tuttiBroadcast(const void *sendbuff,
                             void *recvbuff,
                             size_t count,
                             tuttiDataType_t datatype,
                             int root,
                             tuttiComm_t comm,
                             tuttiQueue_t queue);

// In-place [`tuttiBroadcast`] (NCCL's `ncclBcast`).
//
// # Safety
// As for [`tuttiAllReduce`].
tuttiResult_t tuttiBcast(void *buff,
                         size_t count,
                         tuttiDataType_t datatype,
                         int root,
                         tuttiComm_t comm,
                         tuttiQueue_t queue);

// Reduces `count` elements of every rank's `sendbuff` into the root's
// `recvbuff` (read on the root only). In place: `sendbuff == recvbuff`.
//
// # Safety
// As for [`tuttiAllReduce`].
tuttiResult_t tuttiReduce(const void *sendbuff,
                          void *recvbuff,
                          size_t count,
                          tuttiDataType_t datatype,
                          tuttiRedOp_t op,
                          int root,
                          tuttiComm_t comm,
                          tuttiQueue_t queue);

// Every rank's `sendcount` elements land in every rank's `recvbuff`
// (`nranks * sendcount` elements, in rank order). In place:
// `sendbuff == recvbuff + rank * sendcount` elements.
//
// # Safety
// As for [`tuttiAllReduce`].
tuttiResult_t tuttiAllGather(const void *sendbuff,
                             void *recvbuff,
                             size_t sendcount,
                             tuttiDataType_t datatype,
                             tuttiComm_t comm,
                             tuttiQueue_t queue);

// Reduces every rank's `sendbuff` (`nranks * recvcount` elements); rank r
// receives block r in `recvbuff`. In place:
// `recvbuff == sendbuff + rank * recvcount` elements.
//
// # Safety
// As for [`tuttiAllReduce`].
tuttiResult_t tuttiReduceScatter(const void *sendbuff,
                                 void *recvbuff,
                                 size_t recvcount,
                                 tuttiDataType_t datatype,
                                 tuttiRedOp_t op,
                                 tuttiComm_t comm,
                                 tuttiQueue_t queue);

// Block p (`count` elements) of `sendbuff` goes to rank p, where it lands
// as block r (this rank) of `recvbuff`; both hold `nranks * count`
// elements. In place: `sendbuff == recvbuff`.
//
// # Safety
// As for [`tuttiAllReduce`].
tuttiResult_t tuttiAllToAll(const void *sendbuff,
                            void *recvbuff,
                            size_t count,
                            tuttiDataType_t datatype,
                            tuttiComm_t comm,
                            tuttiQueue_t queue);

// AllToAll with per-peer counts and displacements (elements, `nranks`
// entries each): `sendcounts[p]` elements from `sendbuff + sdispls[p]` go
// to rank p; rank p's block lands at `recvbuff + rdispls[p]`
// (`recvcounts[p]` elements). In place: `sendbuff == recvbuff`.
//
// # Safety
// As for [`tuttiAllReduce`]; the four arrays hold `nranks` entries.
tuttiResult_t tuttiAllToAllv(const void *sendbuff,
                             const size_t *sendcounts,
                             const size_t *sdispls,
                             void *recvbuff,
                             const size_t *recvcounts,
                             const size_t *rdispls,
                             tuttiDataType_t datatype,
                             tuttiComm_t comm,
                             tuttiQueue_t queue);

// Every rank's `sendcount` elements land in the root's `recvbuff`
// (`nranks * sendcount` elements in rank order; read on the root only).
// In place: on the root `sendbuff == recvbuff + root * sendcount`.
//
// # Safety
// As for [`tuttiAllReduce`].
tuttiResult_t tuttiGather(const void *sendbuff,
                          void *recvbuff,
                          size_t sendcount,
                          tuttiDataType_t datatype,
                          int root,
                          tuttiComm_t comm,
                          tuttiQueue_t queue);

// Block p (`recvcount` elements) of the root's `sendbuff` (read on the
// root only) lands in rank p's `recvbuff`. In place: on the root
// `recvbuff == sendbuff + root * recvcount`.
//
// # Safety
// As for [`tuttiAllReduce`].
tuttiResult_t tuttiScatter(const void *sendbuff,
                           void *recvbuff,
                           size_t recvcount,
                           tuttiDataType_t datatype,
                           int root,
                           tuttiComm_t comm,
                           tuttiQueue_t queue);

// Returns (NULL queue) or completes (on a queue) once every rank has
// entered the barrier.
//
// # Safety
// `comm` and `queue` live handles (queue may be NULL).
tuttiResult_t tuttiBarrier(tuttiComm_t comm, tuttiQueue_t queue);

// Sends `count` elements of `sendbuff` to `peer`, which receives them
// with [`tuttiRecv`]. Messages between two ranks match in order.
//
// # Safety
// `sendbuff` valid for `count` elements and untouched until the send
// completes; `comm` and `queue` live handles (queue may be NULL).
tuttiResult_t tuttiSend(const void *sendbuff,
                        size_t count,
                        tuttiDataType_t datatype,
                        int peer,
                        tuttiComm_t comm,
                        tuttiQueue_t queue);

// Receives exactly `count` elements from `peer` into `recvbuff`.
//
// # Safety
// As for [`tuttiSend`], with `recvbuff` writable.
tuttiResult_t tuttiRecv(void *recvbuff,
                        size_t count,
                        tuttiDataType_t datatype,
                        int peer,
                        tuttiComm_t comm,
                        tuttiQueue_t queue);

// Makes a new unique id in `*uniqueId`, for [`tuttiCommInitRank`]. Call
// it in the process that will run rank 0, and pass the id's bytes to the
// other ranks.
//
// # Safety
// `uniqueId` must be NULL or valid for a write of a `tuttiUniqueId`.
tuttiResult_t tuttiGetUniqueId(struct tuttiUniqueId *uniqueId);

// Joins the job named by `commId` as `rank` of `nranks`; blocks until
// every rank has joined (or the connect deadline, `TUTTI_CONNECT_TIMEOUT`).
//
// # Safety
// `comm` must be valid for a write; `commId` must point to an id made by
// [`tuttiGetUniqueId`] (or its bytes).
tuttiResult_t tuttiCommInitRank(tuttiComm_t *comm,
                                int nranks,
                                struct tuttiUniqueId commId,
                                int rank);

// [`tuttiCommInitRank`] with a config (NULL: the defaults).
//
// # Safety
// As for [`tuttiCommInitRank`]; `config` is NULL or an initialized config.
tuttiResult_t tuttiCommInitRankConfig(tuttiComm_t *comm,
                                      int nranks,
                                      struct tuttiUniqueId commId,
                                      int rank,
                                      struct tuttiConfig_t *config);

// Makes `ndev` communicators for `ndev` threads of this process (like
// `ncclCommInitAll`): `comms[r]` is rank `r`. `devlist` is ignored (there
// are no devices) and may be NULL.
//
// # Safety
// `comms` must be valid for writes of `ndev` handles.
tuttiResult_t tuttiCommInitAll(tuttiComm_t *comms, int ndev, const int *devlist);

// Joins the job that the environment describes: `tutti run`'s `TUTTI_*`
// variables, torchrun's, Slurm's or Open MPI's, in that order. `config`
// may be NULL.
//
// # Safety
// `comm` must be valid for a write; `config` NULL or an initialized config.
tuttiResult_t tuttiCommInitFromEnv(tuttiComm_t *comm, struct tuttiConfig_t *config);

// Splits `comm` like `ncclCommSplit`: every rank calls it; ranks with the
// same `color` form `*newcomm`, ranked by `key` (ties: by rank); a rank
// passing [`TUTTI_SPLIT_NOCOLOR`] gets NULL. `config` (may be NULL) sets
// the new communicator's deadline; without one it keeps `comm`'s.
//
// # Safety
// `comm` a live handle; `newcomm` valid for a write; `config` NULL or
// initialized.
tuttiResult_t tuttiCommSplit(tuttiComm_t comm,
                             int color,
                             int key,
                             tuttiComm_t *newcomm,
                             struct tuttiConfig_t *config);

// A new communicator of every rank of `comm` except the
// `excludeRanksCount` ranks listed (like `ncclCommShrink`): after a rank
// died, every survivor calls it with the same list.
//
// # Safety
// `comm` a live handle; `excludeRanksList` valid for
// `excludeRanksCount` reads; `newcomm` valid for a write; `config` NULL
// or initialized.
tuttiResult_t tuttiCommShrink(tuttiComm_t comm,
                              const int *excludeRanksList,
                              int excludeRanksCount,
                              tuttiComm_t *newcomm,
                              struct tuttiConfig_t *config,
                              int shrinkFlags);

// Aborts `comm`: every operation waiting on it, on any thread or queue,
// and every later one fails at once with [`tuttiAborted`]. Callable from
// any thread, also while other calls on `comm` run. Unlike NCCL's
// `ncclCommAbort` it frees nothing (so that those calls never touch freed
// memory): the handle stays valid, and [`tuttiCommDestroy`] frees it once
// no other thread uses it.
//
// # Safety
// `comm` must be a live handle (not yet destroyed).
tuttiResult_t tuttiCommAbort(tuttiComm_t comm);

// Releases `comm` (also after [`tuttiCommAbort`]). As in NCCL, no other
// call on `comm` may run concurrently with this one. Operations still
// queued keep the communicator alive until they end; its threads,
// sockets and shared memory go with the last of them.
//
// # Safety
// `comm` must be a live handle, used by no other thread during this
// call; it must not be used after this call.
tuttiResult_t tuttiCommDestroy(tuttiComm_t comm);

// `tuttiCommFinalize` exists in NCCL to flush operations; here every
// operation of a queue is flushed by `tuttiQueueSynchronize`, so this only
// checks the handle.
//
// # Safety
// `comm` must be a live handle.
tuttiResult_t tuttiCommFinalize(tuttiComm_t comm);

// Writes `comm`'s first asynchronous error to `*asyncError`
// ([`tuttiSuccess`] if none): a timeout, a lost peer, a mismatch or an
// abort that broke it, or the error of an operation that ran on a queue.
// Does not wait.
//
// # Safety
// `comm` a live handle; `asyncError` valid for a write.
tuttiResult_t tuttiCommGetAsyncError(tuttiComm_t comm, tuttiResult_t *asyncError);

// Writes the number of ranks of `comm` to `*count`.
//
// # Safety
// `comm` a live handle; `count` valid for a write.
tuttiResult_t tuttiCommCount(tuttiComm_t comm, int *count);

// Writes this rank's number in `comm` to `*rank`.
//
// # Safety
// `comm` a live handle; `rank` valid for a write.
tuttiResult_t tuttiCommUserRank(tuttiComm_t comm, int *rank);

// Starts a group: data calls until the matching [`tuttiGroupEnd`] are
// collected, not run. Groups nest; the outermost end runs them.
tuttiResult_t tuttiGroupStart(void);

// Ends a group. At the outermost end, every collected call is posted at
// once. If a call of the group had a NULL queue, this waits until all of
// them have completed and returns the first error; otherwise the group
// runs on its calls' queues (after what was put on each before it), and
// this returns at once.
tuttiResult_t tuttiGroupEnd(void);

// The text of a result code (a static string).
const char *tuttiGetErrorString(tuttiResult_t result);

// The full text of the last error: of the last failed call on `comm`, or
// of the last failed call on this thread if `comm` is NULL. It names the
// rank, the call and the peer. The text stays valid until this thread's
// next call of `tuttiGetLastError`; it is empty if nothing failed.
//
// # Safety
// `comm` must be NULL or a live handle.
const char *tuttiGetLastError(tuttiComm_t comm);

// Makes a new queue in `*queue`.
//
// # Safety
// `queue` must be valid for a write.
tuttiResult_t tuttiQueueCreate(tuttiQueue_t *queue);

// Waits until every operation put on `queue` so far has finished. Returns
// the first error among them since the last synchronize (its text is the
// thread's last error), else [`tuttiSuccess`].
//
// # Safety
// `queue` must be a live queue.
tuttiResult_t tuttiQueueSynchronize(tuttiQueue_t queue);

// [`tuttiSuccess`] if every operation put on `queue` has finished (then
// as [`tuttiQueueSynchronize`]: the first error if one failed),
// [`tuttiInProgress`] if some are still running. Does not wait.
//
// # Safety
// `queue` must be a live queue.
tuttiResult_t tuttiQueueQuery(tuttiQueue_t queue);

// Waits for `queue`'s operations, then ends its thread and frees it.
//
// # Safety
// `queue` must be a live queue, used by no other call during or after
// this one.
tuttiResult_t tuttiQueueDestroy(tuttiQueue_t queue);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* TUTTI_H */

/* A config with every field at its default; copy it, then change fields. */
#define TUTTI_CONFIG_INITIALIZER \
  { sizeof(tuttiConfig_t), TUTTI_CONFIG_MAGIC, TUTTI_VERSION_CODE, 0, tuttiAlgoAuto, \
    TUTTI_WIRE_NATIVE }

/* Every bad argument is tuttiInvalidArgument with its reason in the last
 * error; group misuse is tuttiInvalidUsage; an abort from another thread
 * frees a rank blocked in a collective. One process: `tutti run -n 1`. */
#include <pthread.h>
#include <unistd.h>

#include "common.h"

/* `call` fails with `code`, and the last error mentions `why`. */
#define BAD(code, why, call)                                                  \
  do {                                                                        \
    tuttiResult_t r_ = (call);                                                \
    const char *m_ = tuttiGetLastError(NULL);                                 \
    EXPECT(r_ == (code), "%s returned %d, want %d (%s)", #call, r_, code, m_); \
    EXPECT(strstr(m_, why) != NULL, "%s: last error %s lacks %s", #call, m_, why); \
  } while (0)

static tuttiComm_t blocked;
static volatile int entered;

static void *wait_in_allreduce(void *arg) {
  float x[16] = {0};
  entered = 1;
  *(tuttiResult_t *)arg = tuttiAllReduce(x, x, 16, tuttiFloat32, tuttiSum, blocked, NULL);
  return NULL;
}

int main(void) {
  tuttiComm_t comm, pair[2];
  float a[64], b[64];
  int n, me;
  CHECK(tuttiCommInitFromEnv(&comm, NULL));
  CHECK(tuttiCommCount(comm, &n));
  CHECK(tuttiCommUserRank(comm, &me));
  const int I = tuttiInvalidArgument;

  BAD(I, "comm is NULL", tuttiAllReduce(a, b, 4, tuttiFloat32, tuttiSum, NULL, NULL));
  BAD(I, "sendbuff is NULL", tuttiAllReduce(NULL, b, 4, tuttiFloat32, tuttiSum, comm, NULL));
  BAD(I, "recvbuff is NULL", tuttiAllReduce(a, NULL, 4, tuttiFloat32, tuttiSum, comm, NULL));
  CHECK(tuttiAllReduce(NULL, NULL, 0, tuttiFloat32, tuttiSum, comm, NULL)); /* count 0 */
  BAD(I, "unknown datatype 42", tuttiAllReduce(a, b, 4, 42, tuttiSum, comm, NULL));
  BAD(I, "unknown datatype -1", tuttiAllReduce(a, b, 4, -1, tuttiSum, comm, NULL));
  BAD(I, "unknown reduction 9", tuttiAllReduce(a, b, 4, tuttiFloat32, 9, comm, NULL));
  BAD(I, "overlap", tuttiAllReduce(a, a + 1, 4, tuttiFloat32, tuttiSum, comm, NULL));
  BAD(I, "overlap", tuttiAllReduce(a + 3, a, 4, tuttiFloat32, tuttiSum, comm, NULL));
  CHECK(tuttiAllReduce(a, a + 4, 4, tuttiFloat32, tuttiSum, comm, NULL)); /* adjacent */
  CHECK(tuttiAllReduce(a + 4, a, 4, tuttiFloat32, tuttiSum, comm, NULL));
  BAD(I, "overflows", tuttiAllReduce(a, b, (size_t)-1 / 2, tuttiFloat32, tuttiSum, comm, NULL));
  BAD(I, "root 5 is out of range", tuttiBroadcast(a, b, 4, tuttiFloat32, 5, comm, NULL));
  BAD(I, "root -1 is out of range", tuttiReduce(a, b, 4, tuttiFloat32, tuttiSum, -1, comm, NULL));
  BAD(I, "root 7 is out of range", tuttiGather(a, b, 4, tuttiFloat32, 7, comm, NULL));
  BAD(I, "root 7 is out of range", tuttiScatter(a, b, 4, tuttiFloat32, 7, comm, NULL));
  BAD(I, "overlap", tuttiAllGather(a + 1, a, 4, tuttiFloat32, comm, NULL));
  BAD(I, "overlap", tuttiReduceScatter(a, a + 2, 4, tuttiFloat32, tuttiSum, comm, NULL));
  BAD(I, "overlap", tuttiAllToAll(a, a + 1, 4, tuttiFloat32, comm, NULL));
  BAD(I, "sendcounts is NULL",
      tuttiAllToAllv(a, NULL, NULL, b, NULL, NULL, tuttiFloat32, comm, NULL));
  BAD(I, "peer 3 is out of range", tuttiSend(a, 4, tuttiFloat32, 3, comm, NULL));
  BAD(I, "peer -2 is out of range", tuttiRecv(a, 4, tuttiFloat32, -2, comm, NULL));
  BAD(I, "this rank itself", tuttiSend(a, 4, tuttiFloat32, me, comm, NULL));
  BAD(I, "recvbuff is NULL", tuttiRecv(NULL, 4, tuttiFloat32, 0, comm, NULL));
  BAD(I, "rank 0 of 1: tuttiAllGather", tuttiAllGather(NULL, b, 4, tuttiFloat32, comm, NULL));
  BAD(I, "comm is NULL", tuttiBarrier(NULL, NULL));
  BAD(I, "count is NULL", tuttiCommCount(comm, NULL));
  BAD(I, "rank is NULL", tuttiCommUserRank(comm, NULL));
  BAD(I, "uniqueId is NULL", tuttiGetUniqueId(NULL));
  BAD(I, "version is NULL", tuttiGetVersion(NULL));
  BAD(I, "queue is NULL", tuttiQueueCreate(NULL));
  BAD(I, "queue is NULL", tuttiQueueSynchronize(NULL));
  BAD(I, "newcomm is NULL", tuttiCommSplit(comm, 0, 0, NULL, NULL));
  BAD(I, "color -5", tuttiCommSplit(comm, -5, 0, pair, NULL));
  BAD(I, "ndev is 0", tuttiCommInitAll(pair, 0, NULL));
  tuttiUniqueId id;
  memset(&id, 0, sizeof id);
  BAD(I, "rank 3 of 2", tuttiCommInitRank(pair, 2, id, 3));
  BAD(I, "not a tutti unique id", tuttiCommInitRank(pair, 1, id, 0));
  tuttiConfig_t cfg = TUTTI_CONFIG_INITIALIZER;
  cfg.algorithm = 99;
  BAD(I, "algorithm 99", tuttiCommInitFromEnv(pair, &cfg));
  cfg = (tuttiConfig_t)TUTTI_CONFIG_INITIALIZER;
  cfg.magic = 1;
  BAD(I, "magic", tuttiCommInitFromEnv(pair, &cfg));
  BAD(tuttiInvalidUsage, "no group is open", tuttiGroupEnd());
  /* The communicator's own last error names the rank and the call. */
  BAD(I, "root 5", tuttiBroadcast(a, b, 4, tuttiFloat32, 5, comm, NULL));
  EXPECT(strstr(tuttiGetLastError(comm), "rank 0 of 1: tuttiBroadcast") != NULL, "%s",
         tuttiGetLastError(comm));
  EXPECT(strcmp(tuttiGetErrorString(tuttiInvalidArgument), "invalid argument") == 0, "string");
  EXPECT(strcmp(tuttiGetErrorString(12345), "unknown result code") == 0, "unknown string");
  /* Still usable after all that. */
  for (int i = 0; i < 4; i++) a[i] = 1;
  CHECK(tuttiAllReduce(a, b, 4, tuttiFloat32, tuttiSum, comm, NULL));
  EXPECT(b[0] == (float)n, "allreduce after errors: %g", b[0]);

  /* Abort from another thread: rank 0 of a pair of threads waits in an
   * AllReduce that rank 1 never joins; the main thread aborts it. */
  CHECK(tuttiCommInitAll(pair, 2, NULL));
  blocked = pair[0];
  tuttiResult_t got = tuttiSuccess;
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, wait_in_allreduce, &got) == 0, "thread");
  while (!entered) usleep(1000);
  usleep(100000); /* let it block (the outcome is the same if it has not yet) */
  CHECK(tuttiCommAbort(pair[0]));
  pthread_join(t, NULL);
  EXPECT(got == tuttiAborted, "the blocked AllReduce returned %d", got);
  /* An aborted handle stays valid (abort frees nothing): later calls fail
   * at once, and destroy frees it. */
  BAD(tuttiAborted, "tuttiAllReduce", tuttiAllReduce(a, b, 4, tuttiFloat32, tuttiSum, pair[0], NULL));
  CHECK(tuttiCommDestroy(pair[0]));
  CHECK(tuttiCommDestroy(pair[1]));
  CHECK(tuttiCommDestroy(comm));
  printf("OK errors\n");
  return 0;
}

/* Split, then a rank killed (SIGKILL) mid-job: the survivors' next
 * collective fails with tuttiRemoteError, and tuttiCommShrink makes a
 * communicator of the survivors that works. Run as one process (`tutti
 * run -n 1`): it forks its 4 ranks itself, so that the killed one does
 * not stop the job. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

enum { N = 4, DEAD = 2 };

static int rank_main(tuttiUniqueId id, int me) {
  tuttiComm_t comm, half, small;
  tuttiConfig_t cfg = TUTTI_CONFIG_INITIALIZER;
  cfg.timeoutMs = 60000;
  CHECK(tuttiCommInitRankConfig(&comm, N, id, me, &cfg));
  /* Split: odd ranks only; even ranks pass no color and get NULL. */
  CHECK(tuttiCommSplit(comm, me % 2 ? 1 : TUTTI_SPLIT_NOCOLOR, -me, &half, NULL));
  if (me % 2) {
    int hn, hr;
    CHECK(tuttiCommCount(half, &hn));
    CHECK(tuttiCommUserRank(half, &hr));
    EXPECT(hn == 2 && hr == (me == 3 ? 0 : 1), "split: %d of %d", hr, hn);
    int32_t x = me;
    CHECK(tuttiAllReduce(&x, &x, 1, tuttiInt32, tuttiSum, half, NULL));
    EXPECT(x == 4, "split sum %d", x);
    CHECK(tuttiCommDestroy(half));
  } else {
    EXPECT(half == NULL, "NOCOLOR gives NULL");
  }
  float v = 1;
  CHECK(tuttiAllReduce(&v, &v, 1, tuttiFloat32, tuttiSum, comm, NULL));
  EXPECT(v == N, "sum %g", v);
  if (me == DEAD) raise(SIGKILL);
  tuttiResult_t r = tuttiAllReduce(&v, &v, 1, tuttiFloat32, tuttiSum, comm, NULL);
  EXPECT(r == tuttiRemoteError || r == tuttiTimeout, "after the kill: %d %s", r,
         tuttiGetLastError(comm));
  tuttiResult_t async;
  CHECK(tuttiCommGetAsyncError(comm, &async));
  EXPECT(async != tuttiSuccess, "the async error is set");
  int dead[] = {DEAD};
  CHECK(tuttiCommShrink(comm, dead, 1, &small, NULL, TUTTI_SHRINK_DEFAULT));
  int sn, sr;
  CHECK(tuttiCommCount(small, &sn));
  CHECK(tuttiCommUserRank(small, &sr));
  EXPECT(sn == N - 1 && sr == (me < DEAD ? me : me - 1), "shrunk: %d of %d", sr, sn);
  v = (float)me;
  CHECK(tuttiAllReduce(&v, &v, 1, tuttiFloat32, tuttiSum, small, NULL));
  EXPECT(v == (float)(0 + 1 + 3), "sum after shrink %g", v);
  CHECK(tuttiCommDestroy(small));
  CHECK(tuttiCommDestroy(comm));
  return 0;
}

int main(void) {
  tuttiUniqueId id;
  CHECK(tuttiGetUniqueId(&id));
  pid_t kids[N];
  for (int r = 1; r < N; r++) {
    kids[r] = fork();
    EXPECT(kids[r] >= 0, "fork");
    if (kids[r] == 0) _exit(rank_main(id, r));
  }
  int failed = rank_main(id, 0);
  for (int r = 1; r < N; r++) {
    int st;
    EXPECT(waitpid(kids[r], &st, 0) == kids[r], "waitpid");
    if (r == DEAD)
      EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "rank %d: status %d", r, st);
    else
      EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: status %d", r, st);
  }
  if (!failed) printf("OK faults\n");
  return failed;
}

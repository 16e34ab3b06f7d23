/* Every collective and type against a formula, point-to-point exchanges
 * through group calls, and queues with several ops in flight. Run under
 * `tutti run -n N` (N = 1..4). */
#include "common.h"

static int n, me;

static void *vals(tuttiDataType_t t, int op, int q, size_t count) {
  void *b = xmalloc(count * type_size(t));
  for (size_t i = 0; i < count; i++) put(t, b, i, input(op, q, i));
  return b;
}

#define WANT(t, buf, i, w, what)                                              \
  EXPECT(same(t, get(t, buf, i), (w)), "%s %s count %zu: [%zu] = %g, want %g", \
         what, type_name(t), count, (size_t)(i), get(t, buf, i), (double)(w))

static void all_reduce(tuttiComm_t comm, tuttiDataType_t t, size_t count) {
  for (int op = 0; op < tuttiNumOps; op++) {
    void *s = vals(t, op, me, count), *r = xmalloc(count * type_size(t));
    CHECK(tuttiAllReduce(s, r, count, t, op, comm, NULL));
    for (size_t i = 0; i < count; i++) WANT(t, r, i, reduced(t, op, n, i), "allreduce");
    CHECK(tuttiAllReduce(s, s, count, t, op, comm, NULL)); /* in place */
    for (size_t i = 0; i < count; i++) WANT(t, s, i, reduced(t, op, n, i), "allreduce in place");
    free(s);
    free(r);
  }
}

static void rooted(tuttiComm_t comm, tuttiDataType_t t, size_t count) {
  size_t es = type_size(t);
  for (int root = 0; root < n; root += (n > 1 ? n - 1 : 1)) {
    /* Broadcast, out of place and in place. */
    void *s = vals(t, tuttiSum, me, count), *r = xmalloc(count * es);
    CHECK(tuttiBroadcast(s, r, count, t, root, comm, NULL));
    for (size_t i = 0; i < count; i++) WANT(t, r, i, input(tuttiSum, root, i), "broadcast");
    CHECK(tuttiBcast(s, count, t, root, comm, NULL));
    for (size_t i = 0; i < count; i++) WANT(t, s, i, input(tuttiSum, root, i), "bcast");
    free(s);
    /* Reduce (sum and max), out of place and in place on the root. */
    for (int op = tuttiSum; op <= tuttiMax; op += 2) {
      s = vals(t, op, me, count);
      CHECK(tuttiReduce(s, r, count, t, op, root, comm, NULL));
      if (me == root)
        for (size_t i = 0; i < count; i++) WANT(t, r, i, reduced(t, op, n, i), "reduce");
      CHECK(tuttiReduce(s, s, count, t, op, root, comm, NULL));
      if (me == root)
        for (size_t i = 0; i < count; i++) WANT(t, s, i, reduced(t, op, n, i), "reduce in place");
      free(s);
    }
    free(r);
    /* Gather and Scatter: element i of rank q's block is input(q, i). */
    s = vals(t, tuttiSum, me, count);
    void *all = xmalloc(n * count * es);
    CHECK(tuttiGather(s, all, count, t, root, comm, NULL));
    if (me == root)
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
          WANT(t, all, q * count + i, input(tuttiSum, q, i), "gather");
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < count; i++) put(t, all, q * count + i, input(tuttiSum, q + me, i));
    CHECK(tuttiScatter(all, s, count, t, root, comm, NULL));
    for (size_t i = 0; i < count; i++) WANT(t, s, i, input(tuttiSum, me + root, i), "scatter");
    free(s);
    free(all);
  }
}

static void flat(tuttiComm_t comm, tuttiDataType_t t, size_t count) {
  size_t es = type_size(t);
  void *s = vals(t, tuttiSum, me, count), *all = xmalloc(n * count * es);
  /* AllGather, out of place and in place. */
  CHECK(tuttiAllGather(s, all, count, t, comm, NULL));
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) WANT(t, all, q * count + i, input(tuttiSum, q, i), "allgather");
  memset(all, 0, n * count * es);
  memcpy((char *)all + me * count * es, s, count * es);
  CHECK(tuttiAllGather((char *)all + me * count * es, all, count, t, comm, NULL));
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++)
      WANT(t, all, q * count + i, input(tuttiSum, q, i), "allgather in place");
  /* ReduceScatter: every rank sends n blocks of input(q, i); block r sums. */
  void *big = xmalloc(n * count * es);
  for (int b = 0; b < n; b++)
    for (size_t i = 0; i < count; i++) put(t, big, b * count + i, input(tuttiSum, me, i + b));
  CHECK(tuttiReduceScatter(big, s, count, t, tuttiSum, comm, NULL));
  for (size_t i = 0; i < count; i++) WANT(t, s, i, reduced(t, tuttiSum, n, i + me), "reducescatter");
  CHECK(tuttiReduceScatter(big, (char *)big + me * count * es, count, t, tuttiSum, comm, NULL));
  for (size_t i = 0; i < count; i++)
    WANT(t, big, me * count + i, reduced(t, tuttiSum, n, i + me), "reducescatter in place");
  /* AllToAll: block p of rank q holds input(q, i + p); lands as block q on p. */
  for (int b = 0; b < n; b++)
    for (size_t i = 0; i < count; i++) put(t, big, b * count + i, input(tuttiSum, me, i + b));
  CHECK(tuttiAllToAll(big, all, count, t, comm, NULL));
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) WANT(t, all, q * count + i, input(tuttiSum, q, i + me), "alltoall");
  CHECK(tuttiAllToAll(big, big, count, t, comm, NULL));
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) WANT(t, big, q * count + i, input(tuttiSum, q, i + me), "alltoall in place");
  free(s);
  free(all);
  free(big);
}

/* AllToAllV: rank q sends q + p + 1 elements to rank p (values 10q + p). */
static void alltoallv(tuttiComm_t comm) {
  size_t sc[4], sd[4], rc[4], rd[4], st = 0, rt = 0;
  for (int p = 0; p < n; p++) {
    sc[p] = me + p + 1, sd[p] = st, st += sc[p];
    rc[p] = p + me + 1, rd[p] = rt, rt += rc[p];
  }
  int32_t *s = xmalloc(st * 4), *r = xmalloc(rt * 4);
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < sc[p]; i++) s[sd[p] + i] = 10 * me + p;
  CHECK(tuttiAllToAllv(s, sc, sd, r, rc, rd, tuttiInt32, comm, NULL));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < rc[p]; i++)
      EXPECT(r[rd[p] + i] == 10 * p + me, "alltoallv from %d [%zu] = %d", p, i, r[rd[p] + i]);
  free(s);
  free(r);
}

/* Sends and receives in groups: a ring where everybody sends first, with
 * large messages; a send to oneself; a collective in the same group. */
static void groups(tuttiComm_t comm, tuttiQueue_t q) {
  size_t count = 1 << 20;
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  int32_t *out = xmalloc(count * 4), *in = xmalloc(count * 4), *self = xmalloc(count * 4);
  float x = 1.0f;
  for (size_t i = 0; i < count; i++) out[i] = me * 1000 + (int32_t)(i % 1000);
  CHECK(tuttiGroupStart());
  CHECK(tuttiSend(out, count, tuttiInt32, next, comm, q));
  CHECK(tuttiRecv(in, count, tuttiInt32, prev, comm, q));
  CHECK(tuttiSend(out, count, tuttiInt32, me, comm, q));
  CHECK(tuttiRecv(self, count, tuttiInt32, me, comm, q));
  CHECK(tuttiAllReduce(&x, &x, 1, tuttiFloat32, tuttiSum, comm, q));
  CHECK(tuttiGroupEnd());
  if (q) CHECK(tuttiQueueSynchronize(q));
  for (size_t i = 0; i < count; i++) {
    EXPECT(in[i] == prev * 1000 + (int32_t)(i % 1000), "ring [%zu] = %d", i, in[i]);
    EXPECT(self[i] == out[i], "self [%zu] = %d", i, self[i]);
  }
  EXPECT(x == (float)n, "allreduce in a group: %g", x);
  free(out);
  free(in);
  free(self);
}

/* Several ops in flight on one queue, then one synchronize. */
static void queues(tuttiComm_t comm) {
  enum { OPS = 8, COUNT = 4099 };
  tuttiQueue_t q;
  CHECK(tuttiQueueCreate(&q));
  float *b[OPS];
  for (int k = 0; k < OPS; k++) {
    b[k] = xmalloc(COUNT * sizeof(float));
    for (int i = 0; i < COUNT; i++) b[k][i] = (float)(me + k + i % 3);
    CHECK(tuttiAllReduce(b[k], b[k], COUNT, tuttiFloat32, tuttiSum, comm, q));
  }
  CHECK(tuttiBroadcast(b[0], b[0], COUNT, tuttiFloat32, 0, comm, q));
  tuttiResult_t st = tuttiQueueQuery(q);
  EXPECT(st == tuttiSuccess || st == tuttiInProgress, "query: %d", st);
  CHECK(tuttiQueueSynchronize(q));
  CHECK(tuttiQueueQuery(q));
  for (int k = 0; k < OPS; k++) {
    for (int i = 0; i < COUNT; i++) {
      float want = (float)(n * (n - 1) / 2 + n * (k + i % 3));
      EXPECT(b[k][i] == want, "queued op %d [%d] = %g, want %g", k, i, b[k][i], want);
    }
    free(b[k]);
  }
  groups(comm, q);
  CHECK(tuttiQueueDestroy(q));
}

int main(void) {
  tuttiComm_t comm;
  int version;
  CHECK(tuttiGetVersion(&version));
  EXPECT(version == TUTTI_VERSION_CODE, "version %d", version);
  CHECK(tuttiCommInitFromEnv(&comm, NULL));
  CHECK(tuttiCommCount(comm, &n));
  CHECK(tuttiCommUserRank(comm, &me));
  size_t counts[] = {0, 1, 5, 1031};
  for (tuttiDataType_t t = 0; t < tuttiNumTypes; t++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      all_reduce(comm, t, counts[c]);
      rooted(comm, t, counts[c]);
      flat(comm, t, counts[c]);
    }
  alltoallv(comm);
  CHECK(tuttiBarrier(comm, NULL));
  groups(comm, NULL);
  queues(comm);
  tuttiResult_t async;
  CHECK(tuttiCommGetAsyncError(comm, &async));
  EXPECT(async == tuttiSuccess, "async error %d", async);
  CHECK(tuttiCommDestroy(comm));
  printf("OK coll %d/%d\n", me, n);
  return 0;
}

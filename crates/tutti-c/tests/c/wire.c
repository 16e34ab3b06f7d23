/* A communicator whose config asks for a 16-bit wire (tuttiConfig_t's
 * wireType): its float32 sum/avg AllReduce, ReduceScatter and Reduce travel
 * as bfloat16 (results carry bfloat16's rounding), its other calls move
 * their own type exactly; a wire type that is not 16-bit float is refused.
 * Run under `tutti run -n N` (N >= 2). */
#include "common.h"

static int n, me;

/* Whether `x` is a bfloat16 value (its low 16 bits are zero). */
static int is_bf16(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return (b & 0xffff) == 0;
}

int main(void) {
  tuttiComm_t comm, wire;
  CHECK(tuttiCommInitFromEnv(&comm, NULL));
  CHECK(tuttiCommCount(comm, &n));
  CHECK(tuttiCommUserRank(comm, &me));
  EXPECT(n >= 2, "run on 2 or more ranks (got %d)", n);

  tuttiConfig_t cfg = TUTTI_CONFIG_INITIALIZER;
  EXPECT(cfg.wireType == TUTTI_WIRE_NATIVE, "default wireType %d", cfg.wireType);
  cfg.wireType = tuttiInt32;
  tuttiResult_t r = tuttiCommSplit(comm, 0, me, &wire, &cfg);
  EXPECT(r == tuttiInvalidArgument, "an int32 wire: %d", r);
  EXPECT(strstr(tuttiGetLastError(NULL), "wireType") != NULL, "%s", tuttiGetLastError(NULL));
  cfg.wireType = tuttiBfloat16;
  CHECK(tuttiCommSplit(comm, 0, me, &wire, &cfg));

  enum { COUNT = 1024 };
  /* 1 + 2^-10 + i/2^20: not bfloat16 values, so their f32 sum is not either. */
  float *x = xmalloc(COUNT * 4), *y = xmalloc(COUNT * 4);
  for (int i = 0; i < COUNT; i++) x[i] = 1.0f + 0x1p-10f + (float)(i % 7) * 0x1p-20f;
  double tol = (n + 1) * 0x1p-8 * n * 1.01; /* n+1 roundings of bfloat16 of a sum <= n*1.01 */

  /* Without a wire: exact f32 sums. */
  CHECK(tuttiAllReduce(x, y, COUNT, tuttiFloat32, tuttiSum, comm, NULL));
  for (int i = 0; i < COUNT; i++) {
    float want = 0;
    for (int q = 0; q < n; q++) want += x[i];
    EXPECT(y[i] == want, "plain allreduce [%d] = %.9g, want %.9g", i, y[i], want);
  }
  /* With it: bfloat16 on the wire, within n+1 roundings, the same on every rank. */
  CHECK(tuttiAllReduce(x, y, COUNT, tuttiFloat32, tuttiSum, wire, NULL));
  int inexact = 0;
  for (int i = 0; i < COUNT; i++) {
    double exact = (double)n * x[i];
    EXPECT(fabs(y[i] - exact) <= tol, "wire allreduce [%d] = %.9g, exact %.9g", i, y[i], exact);
    inexact += is_bf16(y[i]);
  }
  EXPECT(inexact == COUNT, "only %d of %d results carry bfloat16's rounding", inexact, COUNT);
  float *all = xmalloc((size_t)n * COUNT * 4);
  CHECK(tuttiAllGather(y, all, COUNT, tuttiFloat32, comm, NULL));
  for (int q = 0; q < n; q++)
    EXPECT(memcmp(all + (size_t)q * COUNT, y, COUNT * 4) == 0, "rank %d's result differs", q);
  /* ReduceScatter and Reduce (average) on the wire too. */
  float *big = xmalloc((size_t)n * COUNT * 4);
  for (int i = 0; i < n * COUNT; i++) big[i] = x[i % COUNT];
  CHECK(tuttiReduceScatter(big, y, COUNT, tuttiFloat32, tuttiSum, wire, NULL));
  /* (a rank's own block is added in f32 last and not narrowed: no bit pattern
   * to check, but the wire's rounding shows against the exact f32 sum) */
  for (int i = 0; i < COUNT; i++) {
    float f32 = 0;
    for (int q = 0; q < n; q++) f32 += x[i];
    EXPECT(fabs(y[i] - (double)n * x[i]) <= tol && y[i] != f32, "reducescatter [%d] = %.9g, f32 %.9g",
           i, y[i], f32);
  }
  CHECK(tuttiReduce(x, y, COUNT, tuttiFloat32, tuttiAvg, 0, wire, NULL));
  if (me == 0)
    for (int i = 0; i < COUNT; i++)
      EXPECT(fabs(y[i] - x[i]) <= tol / n, "reduce avg [%d] = %.9g, want %.9g", i, y[i], x[i]);

  /* The wire's communicator moves other calls exactly: a max, integers, a broadcast. */
  CHECK(tuttiAllReduce(x, y, COUNT, tuttiFloat32, tuttiMax, wire, NULL));
  for (int i = 0; i < COUNT; i++) EXPECT(y[i] == x[i], "max [%d] = %.9g", i, y[i]);
  int32_t *k = xmalloc(COUNT * 4), *kk = xmalloc(COUNT * 4);
  for (int i = 0; i < COUNT; i++) k[i] = 1000003 * i + me;
  CHECK(tuttiAllReduce(k, kk, COUNT, tuttiInt32, tuttiSum, wire, NULL));
  for (int i = 0; i < COUNT; i++)
    EXPECT(kk[i] == n * 1000003 * i + n * (n - 1) / 2, "int32 sum [%d] = %d", i, kk[i]);
  CHECK(tuttiBroadcast(x, y, COUNT, tuttiFloat32, 0, wire, NULL));
  for (int i = 0; i < COUNT; i++) EXPECT(y[i] == x[i], "broadcast [%d] = %.9g", i, y[i]);

  /* A split of the wire's communicator without a config keeps the wire. */
  tuttiComm_t sub;
  CHECK(tuttiCommSplit(wire, 0, me, &sub, NULL));
  CHECK(tuttiAllReduce(x, y, COUNT, tuttiFloat32, tuttiSum, sub, NULL));
  for (int i = 0; i < COUNT; i++) EXPECT(is_bf16(y[i]), "split's allreduce [%d] = %.9g", i, y[i]);

  CHECK(tuttiCommDestroy(sub));
  CHECK(tuttiCommDestroy(wire));
  CHECK(tuttiCommDestroy(comm));
  free(x); free(y); free(all); free(big); free(k); free(kk);
  printf("OK wire %d/%d\n", me, n);
  return 0;
}

/* The program of the CMake example (tests/cmake/CMakeLists.txt): every
 * rank contributes rank + 1; the AllReduce's sum is n (n + 1) / 2. */
#include <stdio.h>

#include <tutti.h>

int main(void) {
  tuttiComm_t comm;
  tuttiResult_t r = tuttiCommInitFromEnv(&comm, NULL);
  if (r != tuttiSuccess) {
    fprintf(stderr, "init: %s: %s\n", tuttiGetErrorString(r), tuttiGetLastError(NULL));
    return 1;
  }
  int rank, n;
  tuttiCommUserRank(comm, &rank);
  tuttiCommCount(comm, &n);
  double x[3] = {rank + 1, rank + 1, rank + 1};
  r = tuttiAllReduce(x, x, 3, tuttiFloat64, tuttiSum, comm, NULL);
  if (r != tuttiSuccess) {
    fprintf(stderr, "allreduce: %s\n", tuttiGetLastError(comm));
    return 1;
  }
  for (int i = 0; i < 3; i++) {
    if (x[i] != n * (n + 1) / 2.0) {
      fprintf(stderr, "rank %d: x[%d] = %g, not %g\n", rank, i, x[i], n * (n + 1) / 2.0);
      return 1;
    }
  }
  printf("OK cmake %d/%d\n", rank, n);
  return tuttiCommDestroy(comm) == tuttiSuccess ? 0 : 1;
}

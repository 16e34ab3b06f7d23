// C++ against tutti.h: the header is extern "C"; RAII owns the handles.
#include <tutti.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

static void check(tuttiResult_t r, const char *what) {
  if (r != tuttiSuccess)
    throw std::runtime_error(std::string(what) + ": " + tuttiGetLastError(nullptr));
}

struct CommDeleter {
  void operator()(tuttiComm *c) const { tuttiCommDestroy(c); }
};

int main() {
  try {
    tuttiComm_t raw = nullptr;
    tuttiConfig_t cfg = TUTTI_CONFIG_INITIALIZER;
    cfg.timeoutMs = 60000;
    cfg.algorithm = tuttiAlgoRing;
    check(tuttiCommInitFromEnv(&raw, &cfg), "init");
    std::unique_ptr<tuttiComm, CommDeleter> comm(raw);
    int n = 0, me = 0;
    check(tuttiCommCount(comm.get(), &n), "count");
    check(tuttiCommUserRank(comm.get(), &me), "rank");
    std::vector<double> v(10007, me + 0.5);
    check(tuttiAllReduce(v.data(), v.data(), v.size(), tuttiFloat64, tuttiSum, comm.get(), nullptr),
          "allreduce");
    for (double x : v)
      if (x != n * (n - 1) / 2.0 + 0.5 * n) throw std::runtime_error("wrong sum");
    // Split into even and odd ranks; an AllGather in each half.
    tuttiComm_t half = nullptr;
    check(tuttiCommSplit(comm.get(), me % 2, me, &half, nullptr), "split");
    int hn = 0;
    check(tuttiCommCount(half, &hn), "half count");
    std::vector<int> mine{me}, all(hn);
    check(tuttiAllGather(mine.data(), all.data(), 1, tuttiInt32, half, nullptr), "allgather");
    for (int i = 0; i < hn; i++)
      if (all[i] != me % 2 + 2 * i) throw std::runtime_error("wrong allgather");
    check(tuttiCommDestroy(half), "destroy half");
    std::printf("OK c++ %d/%d\n", me, n);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "FAIL %s\n", e.what());
    return 1;
  }
  return 0;
}

/* Helpers shared by the C tests: checks that print the library's last
 * error, element conversions for every tutti type, and the test data
 * formulas (values unique per rank and index, so results are formulas). */
#ifndef TUTTI_TEST_COMMON_H
#define TUTTI_TEST_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tutti.h>

#define CHECK(call)                                                          \
  do {                                                                       \
    tuttiResult_t r_ = (call);                                               \
    if (r_ != tuttiSuccess) {                                                \
      fprintf(stderr, "FAIL %s:%d: %s returned %d (%s): %s\n", __FILE__,     \
              __LINE__, #call, r_, tuttiGetErrorString(r_),                  \
              tuttiGetLastError(NULL));                                      \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define EXPECT(cond, ...)                                                    \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, "\n");                                                 \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

static inline const char *type_name(tuttiDataType_t t) {
  static const char *names[] = {"int8", "uint8", "int32", "uint32", "int64",
                                "uint64", "float16", "float32", "float64",
                                "bfloat16"};
  return (t >= 0 && t < tuttiNumTypes) ? names[t] : "?";
}

static inline size_t type_size(tuttiDataType_t t) {
  switch (t) {
    case tuttiInt8: case tuttiUint8: return 1;
    case tuttiFloat16: case tuttiBfloat16: return 2;
    case tuttiInt32: case tuttiUint32: case tuttiFloat32: return 4;
    default: return 8;
  }
}

static inline int type_is_int(tuttiDataType_t t) {
  return t != tuttiFloat16 && t != tuttiFloat32 && t != tuttiFloat64 &&
         t != tuttiBfloat16;
}

static inline uint16_t f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t m = x & 0x7fffff;
  if ((x & 0x7fffffff) == 0 || e <= 0) return (uint16_t)sign;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
  if (m & 0x1000) h++; /* round half up: the tests use exact values */
  return (uint16_t)h;
}

static inline float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f,
           m = h & 0x3ff, x;
  float f;
  if (e == 0) {
    f = (float)m / 16777216.0f;
    return sign ? -f : f;
  }
  x = sign | ((e == 31 ? 255 : e - 15 + 127) << 23) | (m << 13);
  memcpy(&f, &x, 4);
  return f;
}

static inline void put(tuttiDataType_t t, void *buf, size_t i, double v) {
  switch (t) {
    case tuttiInt8: ((int8_t *)buf)[i] = (int8_t)(int64_t)v; break;
    case tuttiUint8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case tuttiInt32: ((int32_t *)buf)[i] = (int32_t)(int64_t)v; break;
    case tuttiUint32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
    case tuttiInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case tuttiUint64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
    case tuttiFloat16: ((uint16_t *)buf)[i] = f2h((float)v); break;
    case tuttiFloat32: ((float *)buf)[i] = (float)v; break;
    case tuttiFloat64: ((double *)buf)[i] = v; break;
    case tuttiBfloat16: {
      float f = (float)v;
      uint32_t x;
      memcpy(&x, &f, 4);
      ((uint16_t *)buf)[i] = (uint16_t)(x >> 16);
      break;
    }
  }
}

static inline double get(tuttiDataType_t t, const void *buf, size_t i) {
  switch (t) {
    case tuttiInt8: return ((const int8_t *)buf)[i];
    case tuttiUint8: return ((const uint8_t *)buf)[i];
    case tuttiInt32: return ((const int32_t *)buf)[i];
    case tuttiUint32: return ((const uint32_t *)buf)[i];
    case tuttiInt64: return (double)((const int64_t *)buf)[i];
    case tuttiUint64: return (double)((const uint64_t *)buf)[i];
    case tuttiFloat16: return h2f(((const uint16_t *)buf)[i]);
    case tuttiFloat32: return ((const float *)buf)[i];
    case tuttiFloat64: return ((const double *)buf)[i];
    case tuttiBfloat16: {
      uint32_t x = (uint32_t)((const uint16_t *)buf)[i] << 16;
      float f;
      memcpy(&f, &x, 4);
      return f;
    }
  }
  return NAN;
}

/* Whether `got` is `want` (exactly for integers; to the type's precision
 * for floats). */
static inline int same(tuttiDataType_t t, double got, double want) {
  if (type_is_int(t)) return got == want;
  double tol = (t == tuttiFloat16 || t == tuttiBfloat16) ? 1e-2 : 1e-6;
  return fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1);
}

/* Rank q's input at index i for reduction `op`: small integers, exact in
 * every type (products stay below 2^(ranks)). */
static inline double input(int op, int q, size_t i) {
  if (op == tuttiProd) return 1 + (double)((q + i) % 2);
  return 1 + (double)((q + i) % 7);
}

/* The reduction over `n` ranks of input(op, q, i). */
static inline double reduced(tuttiDataType_t t, int op, int n, size_t i) {
  double acc = input(op, 0, i);
  for (int q = 1; q < n; q++) {
    double v = input(op, q, i);
    switch (op) {
      case tuttiSum: case tuttiAvg: acc += v; break;
      case tuttiProd: acc *= v; break;
      case tuttiMax: acc = v > acc ? v : acc; break;
      case tuttiMin: acc = v < acc ? v : acc; break;
    }
  }
  if (op == tuttiAvg) acc = type_is_int(t) ? floor(acc / n) : acc / n;
  return acc;
}

static inline void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  EXPECT(p != NULL, "out of memory");
  return p;
}

#endif

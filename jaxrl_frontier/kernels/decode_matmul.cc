// A decode step's projection matmul with few rows, f32, on CPU (an XLA FFI handler; built
// and registered by jaxrl_frontier/kernels/build.py).
//
//   out[m, n] = sum_k x[m, k] * w[k, n]
//
//   x      [M, K]          row-major activations (M = the batch rows of one decode step)
//   panels [N / 16, K, 16] the weight w [K, N] packed once per rollout into column panels:
//                          panels[t, k, j] = w[k, 16 t + j]
//   out    [M, N]
//
// A second handler, DecodeMatmulPack, does the packing (w [K, N] -> panels) over the pool.
//
// Why: a decode step multiplies a handful of rows by every weight matrix, so it streams
// all weights from memory once per token. XLA:CPU's dot emitter runs these [16, K] x [K, N]
// products at ~35 to 40 GFLOP/s on one core, whatever the thread count. Here each 16-column
// panel is one contiguous stream, six rows at a time accumulate in registers (12 of the 16
// AVX registers), and the panels are shared out over XLA's intra-op thread pool, so both
// cores stream weights. See docs/performance.md, item 12.
#include <algorithm>
#include <cstdint>

#if defined(__FMA__)
#include <immintrin.h>
#endif

#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v8f __attribute__((vector_size(32)));

constexpr int64_t kPanel = 16;  // columns per panel: two 8-float vectors
constexpr int kRowsPerTile = 6;  // 6 rows x 2 vectors = 12 accumulators

inline v8f load8(const float* p) {
  v8f x;
  __builtin_memcpy(&x, p, sizeof(x));
  return x;
}

inline void store8(float* p, v8f x) { __builtin_memcpy(p, &x, sizeof(x)); }

inline v8f splat(float s) { return v8f{s, s, s, s, s, s, s, s}; }

// a * b + c, fused where the CPU has FMA (-march=native); ISO C++ mode does not contract.
inline v8f fma8(v8f a, v8f b, v8f c) {
#if defined(__FMA__)
  return reinterpret_cast<v8f>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a),
                                               reinterpret_cast<__m256>(b),
                                               reinterpret_cast<__m256>(c)));
#else
  return a * b + c;
#endif
}

// out[r0 .. r0+R, n0 .. n0+16) = x[r0 .. r0+R, :] @ panel, the panel [K, 16] read in order.
template <int R>
inline void Tile(const float* x, const float* panel, float* out, int64_t K, int64_t N,
                 int64_t r0, int64_t n0) {
  v8f acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = v8f{};
  const float* xr = x + r0 * K;
  for (int64_t k = 0; k < K; ++k) {
    const v8f w0 = load8(panel + k * kPanel), w1 = load8(panel + k * kPanel + 8);
    for (int r = 0; r < R; ++r) {
      const v8f xv = splat(xr[r * K + k]);
      acc[r][0] = fma8(xv, w0, acc[r][0]);
      acc[r][1] = fma8(xv, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    store8(out + (r0 + r) * N + n0, acc[r][0]);
    store8(out + (r0 + r) * N + n0 + 8, acc[r][1]);
  }
}

// Every row of x times panel t: out[:, 16 t .. 16 t + 16).
void Panel(const float* x, const float* panels, float* out, int64_t M, int64_t K, int64_t N,
           int64_t t) {
  const float* panel = panels + t * K * kPanel;
  const int64_t n0 = t * kPanel;
  int64_t r = 0;
  for (; r + kRowsPerTile <= M; r += kRowsPerTile) Tile<kRowsPerTile>(x, panel, out, K, N, r, n0);
  switch (M - r) {
    case 5: Tile<5>(x, panel, out, K, N, r, n0); break;
    case 4: Tile<4>(x, panel, out, K, N, r, n0); break;
    case 3: Tile<3>(x, panel, out, K, N, r, n0); break;
    case 2: Tile<2>(x, panel, out, K, N, r, n0); break;
    case 1: Tile<1>(x, panel, out, K, N, r, n0); break;
    default: break;
  }
}

// Panels handed out at a time: enough multiply-adds that claiming one is cheap next to it.
constexpr int64_t kMinChunkWork = 1 << 17;

ffi::Error DecodeMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::F32> panels, ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions();
  const auto pd = panels.dimensions();
  if (xd.size() != 2 || pd.size() != 3 || pd[2] != kPanel) {
    return ffi::Error::InvalidArgument("decode_matmul: x must be [M, K], panels [N/16, K, 16]");
  }
  const int64_t M = xd[0], K = xd[1], tiles = pd[0], N = tiles * kPanel;
  if (pd[1] != K) {
    return ffi::Error::InvalidArgument("decode_matmul: x and the panels disagree on K");
  }
  const float *xp = x.typed_data(), *wp = panels.typed_data();
  float* op = out->typed_data();
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), 8);
  const int64_t tile_work = std::max<int64_t>(1, M * K * kPanel);
  const int64_t per = std::clamp<int64_t>((kMinChunkWork + tile_work - 1) / tile_work, 1,
                                          std::max<int64_t>(1, tiles / (2 * (helpers + 1))));
  const int64_t chunks = (tiles + per - 1) / per;
  if (helpers <= 0 || chunks < 2) {
    for (int64_t t = 0; t < tiles; ++t) Panel(xp, wp, op, M, K, N, t);
    return ffi::Error::Success();
  }
  jaxrl_frontier::ParallelFor(pool, chunks, helpers, [=]() {
    return [=](int64_t c) {
      const int64_t end = std::min(tiles, (c + 1) * per);
      for (int64_t t = c * per; t < end; ++t) Panel(xp, wp, op, M, K, N, t);
    };
  });
  return ffi::Error::Success();
}

// Panels of the packing handed out at a time: enough floats that claiming a chunk is cheap.
constexpr int64_t kMinPackChunk = 1 << 16;

// panels[t, k, :] = w[k, 16 t .. 16 t + 16): each panel row is one 64-byte line of w, and
// each panel is written in order. XLA:CPU's transpose for the same layout change runs at
// ~1.6 GB/s on one thread (a 25M-parameter model's 8 layers took ~120 ms per rollout).
ffi::Error DecodeMatmulPackImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> w,
                                ffi::ResultBuffer<ffi::F32> panels) {
  const auto wd = w.dimensions();
  const auto pd = panels->dimensions();
  if (wd.size() != 2 || pd.size() != 3 || pd[2] != kPanel || wd[1] != pd[0] * kPanel ||
      wd[0] != pd[1]) {
    return ffi::Error::InvalidArgument("decode_matmul pack: w must be [K, N], panels [N/16, K, 16]");
  }
  const int64_t K = wd[0], N = wd[1], tiles = pd[0];
  const float* wp = w.typed_data();
  float* pp = panels->typed_data();
  auto pack = [=](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* dst = pp + t * K * kPanel;
      const float* src = wp + t * kPanel;
      for (int64_t k = 0; k < K; ++k) __builtin_memcpy(dst + k * kPanel, src + k * N, 64);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), 8);
  const int64_t per = std::max<int64_t>(1, kMinPackChunk / std::max<int64_t>(1, K * kPanel));
  const int64_t chunks = (tiles + per - 1) / per;
  if (helpers <= 0 || chunks < 2) {
    pack(0, tiles);
    return ffi::Error::Success();
  }
  jaxrl_frontier::ParallelFor(pool, chunks, helpers, [=]() {
    return [=](int64_t c) { pack(c * per, std::min(tiles, (c + 1) * per)); };
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DecodeMatmulPack, DecodeMatmulPackImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [K, N]
                                  .Ret<ffi::Buffer<ffi::F32>>());  // panels [N/16, K, 16]

XLA_FFI_DEFINE_HANDLER_SYMBOL(DecodeMatmul, DecodeMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x
                                  .Arg<ffi::Buffer<ffi::F32>>()  // panels
                                  .Ret<ffi::Buffer<ffi::F32>>());

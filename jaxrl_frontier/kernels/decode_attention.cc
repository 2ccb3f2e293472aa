// One decode step's grouped-query attention over a KV cache, f32, on CPU (an XLA FFI
// handler; built and registered by jaxrl_frontier/kernels/build.py).
//
//   out[b, h, g, :] = sum_s softmax_s(q[b, h, g, :] . k[b, h, s, :] / sqrt(D) + bias[b, s])
//                     * v[b, h, s, :]
//
//   q, out [B, K, G, D]   (K kv heads, G query heads per kv head, D head dim, D % 8 == 0)
//   k, v   [B, K, S, D]   (the cache's layout: each (row, kv head) block [S, D] contiguous)
//   bias   [B, S]         additive (0 or a large negative number for masked slots)
//
// Why: XLA:CPU runs this as broadcast-multiply-reduce fusions that sweep each K and V
// block once per query head of the group, from memory; here each (row, kv head) block is
// read once, its G queries scored together, and the blocks are shared out over XLA's
// intra-op thread pool. See docs/performance.md ("CPU decode-attention kernel").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f x;
  __builtin_memcpy(&x, p, sizeof(x));
  return x;
}

inline void store8(float* p, v8f x) { __builtin_memcpy(p, &x, sizeof(x)); }

inline float hsum8(v8f x) {
  float s = 0.0f;
  for (int i = 0; i < 8; ++i) s += x[i];
  return s;
}

// exp(x) for x <= 0 (a score minus its row's max), in a form the compiler vectorises:
// 2^(x log2 e) with a degree-6 polynomial on the fraction (relative error ~2e-7). Below
// -87, where f32's exp underflows, it returns 0 as exp does.
inline float exp_nonpositive(float x) {
  const float t = std::max(x, -87.0f) * 1.44269504088896341f;
  const float whole = std::floor(t);
  const float f = t - whole;
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  const float two_to_whole = __builtin_bit_cast(float, (static_cast<int32_t>(whole) + 127) << 23);
  return x < -87.0f ? 0.0f : p * two_to_whole;
}

struct Dims {
  int64_t rows, kv_heads, group, head_dim, slots;
  float scale;
};

// Scores of `num` (1 or 4) query heads against every slot: sc[g * S + s].
inline void Scores(const Dims& d, const float* q, const float* k, const float* bias, float* sc,
                   int64_t first, int64_t num) {
  const int64_t D = d.head_dim, S = d.slots, D8 = D / 8;
  if (num == 4) {
    const float *q0 = q + first * D, *q1 = q0 + D, *q2 = q1 + D, *q3 = q2 + D;
    for (int64_t s = 0; s < S; ++s) {
      const float* kr = k + s * D;
      v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int64_t j = 0; j < D8; ++j) {
        const v8f kv = load8(kr + 8 * j);
        a0 += load8(q0 + 8 * j) * kv;
        a1 += load8(q1 + 8 * j) * kv;
        a2 += load8(q2 + 8 * j) * kv;
        a3 += load8(q3 + 8 * j) * kv;
      }
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
      // One reduction tree for the four sums: u = [a0 a0 a2 a2 a1 a1 a3 a3] partial sums.
      const v8f t01 = __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 8, 9, 10, 11) +
                      __builtin_shufflevector(a0, a1, 4, 5, 6, 7, 12, 13, 14, 15);
      const v8f t23 = __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 8, 9, 10, 11) +
                      __builtin_shufflevector(a2, a3, 4, 5, 6, 7, 12, 13, 14, 15);
      const v8f u = __builtin_shufflevector(t01, t23, 0, 1, 8, 9, 4, 5, 12, 13) +
                    __builtin_shufflevector(t01, t23, 2, 3, 10, 11, 6, 7, 14, 15);
      const float sum[4] = {u[0] + u[1], u[4] + u[5], u[2] + u[3], u[6] + u[7]};
#else
      const float sum[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
#endif
      for (int64_t g = 0; g < 4; ++g) sc[(first + g) * S + s] = sum[g] * d.scale + bias[s];
    }
    return;
  }
  const float* qr = q + first * D;
  for (int64_t s = 0; s < S; ++s) {
    const float* kr = k + s * D;
    v8f acc = {};
    for (int64_t j = 0; j < D8; ++j) acc += load8(qr + 8 * j) * load8(kr + 8 * j);
    sc[first * S + s] = hsum8(acc) * d.scale + bias[s];
  }
}

// One (row, kv head) block: q [G, D], k and v [S, D], bias [S] -> out [G, D].
void Block(const Dims& d, const float* q, const float* k, const float* v, const float* bias,
           float* out, float* sc) {
  const int64_t G = d.group, D = d.head_dim, S = d.slots, D8 = D / 8;
  int64_t g = 0;
  for (; g + 4 <= G; g += 4) Scores(d, q, k, bias, sc, g, 4);
  for (; g < G; ++g) Scores(d, q, k, bias, sc, g, 1);
  for (int64_t h = 0; h < G; ++h) {  // softmax over the slots
    float* row = sc + h * S;
    float m = row[0];
    for (int64_t s = 1; s < S; ++s) m = std::max(m, row[s]);
    for (int64_t s = 0; s < S; ++s) row[s] = exp_nonpositive(row[s] - m);
    float total = 0.0f;
    for (int64_t s = 0; s < S; ++s) total += row[s];
    const float inv = 1.0f / total;
    for (int64_t s = 0; s < S; ++s) row[s] *= inv;
  }
  for (int64_t h = 0; h < G; ++h) {  // p . v, up to four output vectors held in registers
    const float* p = sc + h * S;
    for (int64_t j0 = 0; j0 < D8; j0 += 4) {
      const int64_t nj = std::min<int64_t>(4, D8 - j0);
      v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int64_t s = 0; s < S; ++s) {
        const float* vr = v + s * D + 8 * j0;
        a0 += p[s] * load8(vr);
        if (nj > 1) a1 += p[s] * load8(vr + 8);
        if (nj > 2) a2 += p[s] * load8(vr + 16);
        if (nj > 3) a3 += p[s] * load8(vr + 24);
      }
      float* o = out + h * D + 8 * j0;
      store8(o, a0);
      if (nj > 1) store8(o + 8, a1);
      if (nj > 2) store8(o + 16, a2);
      if (nj > 3) store8(o + 24, a3);
    }
  }
}

// Below this many multiply-adds per call the blocks run on the calling thread: handing
// work to the pool costs more than it saves (16 rows x 2 kv heads x 4 x 32 at < 64 slots).
constexpr int64_t kMinParallelWork = 1 << 18;

ffi::Error DecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                               ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                               ffi::Buffer<ffi::F32> bias, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions();
  const auto kd = k.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || bias.dimensions().size() != 2) {
    return ffi::Error::InvalidArgument("decode_attention: q, k, v must be 4-D, bias 2-D");
  }
  const Dims d{qd[0], qd[1], qd[2], qd[3], kd[2], 1.0f / std::sqrt(static_cast<float>(qd[3]))};
  if (d.head_dim % 8 != 0) {
    return ffi::Error::InvalidArgument("decode_attention: head dim must be a multiple of 8");
  }
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const float* bp = bias.typed_data();
  float* op = out->typed_data();
  const int64_t blocks = d.rows * d.kv_heads;
  auto run = [=](int64_t i, float* sc) {
    Block(d, qp + i * d.group * d.head_dim, kp + i * d.slots * d.head_dim,
          vp + i * d.slots * d.head_dim, bp + (i / d.kv_heads) * d.slots,
          op + i * d.group * d.head_dim, sc);
  };
  const int64_t work = blocks * d.slots * d.group * d.head_dim;
  const int64_t helpers = work < kMinParallelWork ? 0 : std::min<int64_t>(pool.num_threads(), 8);
  if (helpers <= 0) {
    std::vector<float> sc(d.group * d.slots);
    for (int64_t i = 0; i < blocks; ++i) run(i, sc.data());
    return ffi::Error::Success();
  }
  // Blocks shared out over the pool; each thread keeps one scores buffer.
  jaxrl_frontier::ParallelFor(pool, blocks, helpers, [run, d]() {
    return [run, sc = std::vector<float>(d.group * d.slots)](int64_t i) mutable {
      run(i, sc.data());
    };
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DecodeAttention, DecodeAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // bias
                                  .Ret<ffi::Buffer<ffi::F32>>());

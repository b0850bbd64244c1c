#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "cpu_primitive.h"
#include "parallel.h"
#include "vec.h"

namespace mlxd {

using namespace mlx::core;

namespace {

enum MaskKind : int { kNone = 0, kCausal = 1, kBool = 2, kAdditive = 3 };

constexpr int kTileRows = 4;   // query rows per register tile
constexpr int kTileKeys = 16;  // score rows are padded to a multiple of this (vector loops)
// A long context's keys and values do not fit in cache: read once per 4-row tile, they
// made attention memory-bound (a 512-token chunk after 22K cached tokens: ~6 CPU-s per
// layer, ~30x the chunk's matmuls). So the tiles of a group of rows take each block of
// keys (and then of values) in turn while it is in L2: 256 rows of a 64-float head are
// 64 KB. Every row still sums in key order, so the results are the same bits.
constexpr int kGroupTiles = 8;
constexpr int kKeyBlock = 256;  // a multiple of 4: keys take the same 4-key or 1-key path as unblocked
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Everything a task needs; copied into the dispatched closure (no references to arrays).
struct Job {
  const float* q;
  const float* k;
  const float* v;
  int64_t qs[3], ks[3], vs[3];  // strides of the first three axes, in floats
  float* out;                   // (B, Hq, L, D), contiguous
  int B, Hq, Hkv, L, S, D;
  float scale;
  int mask_kind;
  const void* mask;
  int64_t ms[4];
  int rows_per_item;
};

// Scores of up to kTileRows query rows (scaled, D floats each, zero rows past the real
// ones) against the first `keys` key rows: scores[r * width + j], one dot product per
// (row, key) in eight lanes over the head dim. The only scoring, for decode and prefill
// alike: a row's scores then never depend on how many rows share its call, so a prompt's
// last token scores the same alone (a decode step) as inside a prefill segment (after a
// prefix-cache hit). A key-transposed tile was faster for prefill but summed in another
// order and broke that equality.
void score_rows_direct(const float* qs, int rows, const float* k, int64_t kstride, int keys, int D,
                       int width, float* scores) {
  const int dv = D / 8;
  int j = 0;
  // Four keys at a time: the same eight-lane products, and their lanes summed four
  // scores at once (hsum4) instead of one by one.
  for (; j + 4 <= keys; j += 4) {
    v8f acc[kTileRows][4] = {};
    for (int t = 0; t < dv; ++t) {
      v8f kv[4];
      for (int u = 0; u < 4; ++u) kv[u] = load8(k + (j + u) * kstride + 8 * t);
      for (int r = 0; r < kTileRows; ++r) {
        v8f qv = load8(qs + r * D + 8 * t);
        for (int u = 0; u < 4; ++u) acc[r][u] += qv * kv[u];
      }
    }
    for (int r = 0; r < rows; ++r) {
      hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], scores + static_cast<int64_t>(r) * width + j);
    }
  }
  for (; j < keys; ++j) {
    const float* row = k + j * kstride;
    v8f acc[kTileRows] = {};
    for (int t = 0; t < dv; ++t) {
      v8f kv = load8(row + 8 * t);
      for (int r = 0; r < kTileRows; ++r) acc[r] += load8(qs + r * D + 8 * t) * kv;
    }
    for (int r = 0; r < rows; ++r) scores[static_cast<int64_t>(r) * width + j] = hsum(acc[r]);
  }
}

// Masks, exponentiates and normalizes one row of scores in place (keys >= limit get
// probability 0). Returns 1/sum, or 0 when no key is visible.
float softmax_row(const Job& job, int b, int h, int i, int limit, int sp, float* s) {
  if (job.mask_kind == kBool) {
    const uint8_t* m = static_cast<const uint8_t*>(job.mask) + b * job.ms[0] + h * job.ms[1] + i * job.ms[2];
    for (int j = 0; j < limit; ++j) {
      if (!m[j * job.ms[3]]) s[j] = kNegInf;
    }
  } else if (job.mask_kind == kAdditive) {
    const float* m = static_cast<const float*>(job.mask) + b * job.ms[0] + h * job.ms[1] + i * job.ms[2];
    for (int j = 0; j < limit; ++j) s[j] += m[j * job.ms[3]];
  }
  for (int j = std::max(limit, 0); j < sp; ++j) s[j] = kNegInf;
  v8f vmax = splat(kNegInf);
  for (int j = 0; j < sp; j += 8) {
    v8f x = load8(s + j);
    vmax = x > vmax ? x : vmax;
  }
  float top = hmax(vmax);
  if (!(top > kNegInf)) return 0.0f;
  v8f vtop = splat(top);
  for (int j = 0; j < sp; j += 8) store8(s + j, exp8(load8(s + j) - vtop));
  // Summed in key order, one float at a time: vector lanes would group keys by their
  // position mod 8, which moves with a batch's left padding and changes the rounding.
  float sum = 0.0f;
  for (int j = 0; j < limit; ++j) sum += s[j];
  return 1.0f / sum;
}

// For a tile of query rows: acc[r] += sum_j p[r][j] * V[j] over keys [j0, j1), for NV
// vectors (8 * NV floats) of the head dim starting at float `first`; `acc` holds each
// row's running sums (D floats a row), so a row's sums run in key order across blocks.
// Each value row is loaded once per tile, not once per query row; keys past a row's
// limit have p = 0.
template <int NV>
void weighted_values_part(const float* p, int width, int j0, int j1, const float* v, int64_t vstride, int D,
                          int first, float* acc) {
  v8f a[kTileRows][NV];
  for (int r = 0; r < kTileRows; ++r) {
    for (int t = 0; t < NV; ++t) a[r][t] = load8(acc + r * D + first + 8 * t);
  }
  for (int j = j0; j < j1; ++j) {
    const float* row = v + j * vstride + first;
    v8f vals[NV];
    for (int t = 0; t < NV; ++t) vals[t] = load8(row + 8 * t);
    for (int r = 0; r < kTileRows; ++r) {
      v8f w = splat(p[r * width + j]);
      for (int t = 0; t < NV; ++t) a[r][t] += w * vals[t];
    }
  }
  for (int r = 0; r < kTileRows; ++r) {
    for (int t = 0; t < NV; ++t) store8(acc + r * D + first + 8 * t, a[r][t]);
  }
}

void weighted_values(const float* p, int width, int j0, int j1, const float* v, int64_t vstride, int D,
                     float* acc) {
  int first = 0;
  for (; first + 32 <= D; first += 32) weighted_values_part<4>(p, width, j0, j1, v, vstride, D, first, acc);
  for (; first < D; first += 8) weighted_values_part<1>(p, width, j0, j1, v, vstride, D, first, acc);
}

int keys_width(int keys) {
  return std::max(kTileKeys, (keys + kTileKeys - 1) / kTileKeys * kTileKeys);
}

// One block of query rows of one (batch, kv head).
void run_item(const Job& job, int64_t item) {
  const int G = job.Hq / job.Hkv;
  const int rows_per_head = G * job.L;  // row r is query position r / G of head r % G
  const int blocks = (rows_per_head + job.rows_per_item - 1) / job.rows_per_item;
  const int bk = static_cast<int>(item / blocks);
  const int b = bk / job.Hkv, kvh = bk % job.Hkv;
  const int r0 = static_cast<int>(item % blocks) * job.rows_per_item;
  const int r1 = std::min(rows_per_head, r0 + job.rows_per_item);
  const bool causal = job.mask_kind == kCausal;
  auto limit_of = [&](int i) {
    return causal ? std::clamp(job.S - job.L + i + 1, 0, job.S) : job.S;
  };
  const int keys = limit_of((r1 - 1) / G);
  const int width = keys_width(keys);
  const int D = job.D;

  constexpr int kGroupRows = kTileRows * kGroupTiles;
  thread_local std::vector<float> qs, scores, acc;
  qs.resize(static_cast<size_t>(kGroupRows) * D);
  scores.resize(static_cast<size_t>(kGroupRows) * width);
  acc.resize(static_cast<size_t>(kGroupRows) * D);
  const float* kbase = job.k + b * job.ks[0] + kvh * job.ks[1];
  const float* vbase = job.v + b * job.vs[0] + kvh * job.vs[1];

  for (int gb = r0; gb < r1; gb += kGroupRows) {
    const int group_rows = std::min(kGroupRows, r1 - gb);
    const int tiles = (group_rows + kTileRows - 1) / kTileRows;
    std::fill(qs.begin(), qs.end(), 0.0f);  // rows past the real ones stay zero
    for (int r = 0; r < group_rows; ++r) {
      const int i = (gb + r) / G, h = kvh * G + (gb + r) % G;
      const float* qrow = job.q + b * job.qs[0] + h * job.qs[1] + i * job.qs[2];
      for (int d = 0; d < D; ++d) qs[r * D + d] = qrow[d] * job.scale;
    }
    for (int kb = 0; kb < keys; kb += kKeyBlock) {
      const int n = std::min(kKeyBlock, keys - kb);
      for (int t = 0; t < tiles; ++t) {
        score_rows_direct(qs.data() + static_cast<size_t>(t) * kTileRows * D,
                          std::min(kTileRows, group_rows - t * kTileRows), kbase + kb * job.ks[2], job.ks[2], n,
                          D, width, scores.data() + static_cast<size_t>(t) * kTileRows * width + kb);
      }
    }
    float inv[kGroupRows] = {};
    float* outs[kGroupRows] = {};
    int keys_used[kGroupTiles] = {};
    for (int r = 0; r < tiles * kTileRows; ++r) {
      float* s = scores.data() + static_cast<size_t>(r) * width;
      if (r >= group_rows) {  // padding rows of the last tile take no part
        std::fill(s, s + width, 0.0f);
        continue;
      }
      const int i = (gb + r) / G, h = kvh * G + (gb + r) % G;
      const int limit = limit_of(i);
      inv[r] = softmax_row(job, b, h, i, limit, width, s);
      outs[r] = job.out + ((static_cast<int64_t>(b) * job.Hq + h) * job.L + i) * D;
      keys_used[r / kTileRows] = std::max(keys_used[r / kTileRows], limit);
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    const int most = *std::max_element(keys_used, keys_used + tiles);
    for (int kb = 0; kb < most; kb += kKeyBlock) {
      for (int t = 0; t < tiles; ++t) {
        const int end = std::min(kb + kKeyBlock, keys_used[t]);
        if (end > kb) {
          weighted_values(scores.data() + static_cast<size_t>(t) * kTileRows * width, width, kb, end, vbase,
                          job.vs[2], D, acc.data() + static_cast<size_t>(t) * kTileRows * D);
        }
      }
    }
    for (int r = 0; r < group_rows; ++r) {
      if (inv[r] == 0.0f) {  // a row that sees no key
        std::fill(outs[r], outs[r] + D, 0.0f);
        continue;
      }
      v8f scale = splat(inv[r]);
      for (int d = 0; d < D; d += 8) store8(outs[r] + d, load8(acc.data() + r * D + d) * scale);
    }
  }
}

// Every block of rows, across cores.
void run_job(const Job& job, int64_t items, double work) {
  parallel_for(items, work, [&job](int64_t item) { run_item(job, item); });
}

// Copies `a` into a contiguous buffer when its last axis is strided.
const float* last_axis_contiguous(const array& a, std::vector<float>& copy, int64_t strides[3]) {
  if (a.strides()[3] == 1) {
    for (int i = 0; i < 3; ++i) strides[i] = a.strides()[i];
    return a.data<float>();
  }
  const auto& sh = a.shape();
  copy.resize(a.size());
  const float* src = a.data<float>();
  size_t n = 0;
  for (int i0 = 0; i0 < sh[0]; ++i0)
    for (int i1 = 0; i1 < sh[1]; ++i1)
      for (int i2 = 0; i2 < sh[2]; ++i2)
        for (int i3 = 0; i3 < sh[3]; ++i3)
          copy[n++] = src[i0 * a.strides()[0] + i1 * a.strides()[1] + i2 * a.strides()[2] + i3 * a.strides()[3]];
  strides[0] = static_cast<int64_t>(sh[1]) * sh[2] * sh[3];
  strides[1] = static_cast<int64_t>(sh[2]) * sh[3];
  strides[2] = sh[3];
  return copy.data();
}

class Attention : public CpuPrimitive {
 public:
  Attention(Stream stream, float scale, int mask_kind)
      : CpuPrimitive(stream, "MlxdAttention"), scale_(scale), mask_kind_(mask_kind) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array& q = inputs[0];
    const array& k = inputs[1];
    const array& v = inputs[2];
    array& out = outputs[0];
    auto& encoder = prepare(inputs, out);

    Job job{};
    job.B = q.shape(0);
    job.Hq = q.shape(1);
    job.L = q.shape(2);
    job.D = q.shape(3);
    job.Hkv = k.shape(1);
    job.S = k.shape(2);
    job.scale = scale_;
    job.mask_kind = mask_kind_;
    job.out = out.data<float>();
    if (mask_kind_ == kBool || mask_kind_ == kAdditive) {
      const array& m = inputs[3];
      job.mask = mask_kind_ == kBool ? static_cast<const void*>(m.data<bool>())
                                     : static_cast<const void*>(m.data<float>());
      for (int i = 0; i < 4; ++i) job.ms[i] = m.strides()[i];
    }
    // Enough items to keep every core busy, each large enough to repay its key transpose.
    const int rows_per_head = (job.Hq / job.Hkv) * job.L;
    const int64_t heads = static_cast<int64_t>(job.B) * job.Hkv;
    const int64_t target_items = 8LL * kernel_threads();
    int64_t rows = (rows_per_head * heads + target_items - 1) / target_items;
    rows = std::clamp<int64_t>((rows + kTileRows - 1) / kTileRows * kTileRows, 16, 256);
    job.rows_per_item = static_cast<int>(std::min<int64_t>(rows, rows_per_head));
    const int64_t items = heads * ((rows_per_head + job.rows_per_item - 1) / job.rows_per_item);
    const double work = 2.0 * job.B * job.Hq * static_cast<double>(job.L) * job.S * job.D;

    encoder.dispatch([job, items, work, q, k, v]() mutable {
      std::vector<float> qc, kc, vc;
      job.q = last_axis_contiguous(q, qc, job.qs);
      job.k = last_axis_contiguous(k, kc, job.ks);
      job.v = last_axis_contiguous(v, vc, job.vs);
      run_job(job, items, work);
    });
  }



  bool is_equivalent(const Primitive& other) const override {
    const auto& o = static_cast<const Attention&>(other);
    return scale_ == o.scale_ && mask_kind_ == o.mask_kind_;
  }

 private:
  float scale_;
  int mask_kind_;
};

}  // namespace

array attention(
    const array& q,
    const array& k,
    const array& v,
    float scale,
    bool causal,
    const std::optional<array>& mask,
    StreamOrDevice s) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) {
    throw std::invalid_argument("attention: q, k, v must be 4-D (B, H, L, D)");
  }
  if (q.dtype() != float32 || k.dtype() != float32 || v.dtype() != float32) {
    throw std::invalid_argument("attention: float32 only");
  }
  const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int Hkv = k.shape(1), S = k.shape(2);
  if (k.shape(0) != B || v.shape() != k.shape() || k.shape(3) != D || Hkv == 0 || Hq % Hkv != 0) {
    throw std::invalid_argument("attention: q (B,Hq,L,D), k and v (B,Hkv,S,D), Hq % Hkv == 0");
  }
  if (D % 8 != 0 || D > 256) {
    throw std::invalid_argument("attention: head dim must be a multiple of 8, at most 256");
  }
  Stream stream = to_stream(s);
  std::vector<array> inputs = {q, k, v};
  int kind = causal ? kCausal : kNone;
  if (mask.has_value()) {
    if (causal) throw std::invalid_argument("attention: causal and a mask array are exclusive");
    array m = *mask;
    if (m.dtype() == bool_) {
      kind = kBool;
    } else {
      m = astype(m, float32, stream);
      kind = kAdditive;
    }
    inputs.push_back(broadcast_to(m, {B, Hq, L, S}, stream));
  }
  return array(
      {B, Hq, L, D}, float32, std::make_shared<Attention>(stream, scale, kind), std::move(inputs));
}

}  // namespace mlxd

// Fused CPU kernels for the small operators of a decode step (notebook 00, where the time goes).
//
// At batch 1 a decode step of the 135M model spends about half its time outside the matmuls:
// each small torch operator (a multiply, a mean, a concatenation...) costs a few microseconds
// of dispatch and Python, whatever its size, and a layer of the plain-torch model runs
// about 30 of them. These three ops do the same arithmetic in one call each, in the same
// order and with the same roundings as the plain-torch code in transformer.py, which stays the
// reference (and the path on a GPU, where torch.compile fuses instead):
//
//   rms_norm(x, w, eps)          w * to_dtype(x * rsqrt(mean(x^2) + eps))        x in fp32
//   add_rms_norm(x, d, w, eps)   h = x + d, then rms_norm(h): returns (h, normed)
//   rope(qkv, cos, sin, heads)   rotates the first `heads` heads of each token: x*cos + rot(x)*sin
//   silu_mul(gate_up)            silu(gate) * up, gate and up the two halves of the last dimension
//
// Every tensor is contiguous, rows are the last dimension; one row is tiny (576 numbers for
// the 135M model), so threads split rows only when there are many of them (a prefill).
// Built on first use by cpp_build.py, with -ffp-contract=off so that a*b + c*d rounds twice,
// as torch's separate operators do.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kRowsPerThread = 16;   // fewer rows than this run on the calling thread

void check_rows(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), op, ": contiguous tensors only");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, op, ": x must have a last dimension of at least 1");
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0), op, ": weight must be (", x.size(-1), ",)");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), op, ": weight and x must share a dtype");
}

// One row: out = w * to_dtype(x * inv), inv = 1 / sqrt(mean(x^2) + eps), x read as float.
template <typename T>
void norm_row(const T* x, const T* w, T* out, int64_t n, double eps) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    sum += v * v;
  }
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) {
    const T normed = static_cast<T>(static_cast<float>(x[i]) * inv);      // rounded to x's dtype
    out[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(normed));
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "rms_norm");
  auto out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t *px = x.data_ptr<scalar_t>(), *pw = weight.data_ptr<scalar_t>();
    scalar_t* po = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowsPerThread, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) norm_row(px + r * n, pw, po + r * n, n, eps);
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                const at::Tensor& weight, double eps) {
  check_rows(x, weight, "add_rms_norm");
  TORCH_CHECK(delta.sizes() == x.sizes() && delta.scalar_type() == x.scalar_type() && delta.is_contiguous(),
              "add_rms_norm: delta must be contiguous, with x's shape and dtype");
  auto sum = at::empty_like(x), out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    const scalar_t *px = x.data_ptr<scalar_t>(), *pd = delta.data_ptr<scalar_t>(), *pw = weight.data_ptr<scalar_t>();
    scalar_t *ps = sum.data_ptr<scalar_t>(), *po = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowsPerThread, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t i = 0; i < n; ++i)                                  // the residual add, rounded
          ps[r * n + i] = static_cast<scalar_t>(static_cast<float>(px[r * n + i]) + static_cast<float>(pd[r * n + i]));
        norm_row(ps + r * n, pw, po + r * n, n, eps);
      }
    });
  });
  return {sum, out};
}

// qkv: (B, T, heads_total, D); cos, sin: (B, T, D). The first `heads` heads of each token are
// rotated: out[j] = x[j]*cos[j] + r[j]*sin[j], r = (-x[D/2:], x[:D/2]); the others are copied.
at::Tensor rope(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t heads) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.dim() == 4 && qkv.is_contiguous(), "rope: qkv must be a contiguous (B, T, H, D) CPU tensor");
  const int64_t B = qkv.size(0), T = qkv.size(1), H = qkv.size(2), D = qkv.size(3), half = D / 2;
  TORCH_CHECK(D % 2 == 0 && heads >= 0 && heads <= H, "rope: D must be even and 0 <= heads <= H");
  TORCH_CHECK(cos.sizes() == at::IntArrayRef({B, T, D}) && sin.sizes() == cos.sizes() && cos.is_contiguous() &&
              sin.is_contiguous() && cos.scalar_type() == qkv.scalar_type() && sin.scalar_type() == qkv.scalar_type(),
              "rope: cos and sin must be contiguous (B, T, D) tensors of qkv's dtype");
  auto out = at::empty_like(qkv);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope", [&] {
    const scalar_t *px = qkv.data_ptr<scalar_t>(), *pc = cos.data_ptr<scalar_t>(), *ps = sin.data_ptr<scalar_t>();
    scalar_t* po = out.data_ptr<scalar_t>();
    at::parallel_for(0, B * T, kRowsPerThread, [&](int64_t begin, int64_t end) {
      for (int64_t token = begin; token < end; ++token) {
        const scalar_t *c = pc + token * D, *s = ps + token * D;
        for (int64_t h = 0; h < H; ++h) {
          const scalar_t* x = px + (token * H + h) * D;
          scalar_t* o = po + (token * H + h) * D;
          if (h >= heads) {
            for (int64_t j = 0; j < D; ++j) o[j] = x[j];
            continue;
          }
          for (int64_t j = 0; j < D; ++j) {
            const float rotated = j < half ? -static_cast<float>(x[j + half]) : static_cast<float>(x[j - half]);
            const scalar_t a = static_cast<scalar_t>(static_cast<float>(x[j]) * static_cast<float>(c[j]));
            const scalar_t b = static_cast<scalar_t>(rotated * static_cast<float>(s[j]));
            o[j] = static_cast<scalar_t>(static_cast<float>(a) + static_cast<float>(b));
          }
        }
      }
    });
  });
  return out;
}

// gate_up: (..., 2 I) -> (..., I): silu(g) = g / (1 + exp(-g)) rounded to the dtype, times u, rounded.
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu() && gate_up.is_contiguous() && gate_up.dim() >= 1 && gate_up.size(-1) > 0 &&
              gate_up.size(-1) % 2 == 0,
              "silu_mul: gate_up must be a contiguous CPU tensor with an even, non-zero last dimension");
  const int64_t width = gate_up.size(-1) / 2, rows = gate_up.numel() / gate_up.size(-1);
  auto sizes = gate_up.sizes().vec();
  sizes.back() = width;
  auto out = at::empty(sizes, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_mul", [&] {
    const scalar_t* pg = gate_up.data_ptr<scalar_t>();
    scalar_t* po = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowsPerThread, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t *g = pg + r * 2 * width, *u = g + width;
        for (int64_t i = 0; i < width; ++i) {
          const float x = static_cast<float>(g[i]);
          const scalar_t silu = static_cast<scalar_t>(x / (1.f + std::exp(-x)));
          po[r * width + i] = static_cast<scalar_t>(static_cast<float>(silu) * static_cast<float>(u[i]));
        }
      }
    });
  });
  return out;
}

// ---- one whole decode layer in one call (issue 40) --------------------------------------------------
// A batch-1 decode step of the 135M model spent half its time in Python and the framework's
// dispatch (700 operator calls a step, about 23 a layer: lab/roofline_step_profile.py). `decode_block`
// runs a Llama layer for one new token per row with the same pieces the layer's Python code
// calls, from C++: the norms, rope and silu_mul above, each linear through aten (a float weight)
// or through the dispatcher to our W4A8 kernel (packed int4 weights, quant/w4a8.cpp), the cache
// write, and `attend_new_rows` below for the attention; `decode_block_paged` does the same over the
// serving engine's paged pool.

float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};   // 8 running sums: vectorizable
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += a[i + j] * b[i + j];
  float sum = 0.f;
  for (int j = 0; j < 8; ++j) sum += lanes[j];
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// The attention of one new token per row, over any cache layout. q: (B, heads, D); row b attends
// to its positions 0..length(b)-1 (the new token's included), whose key and value rows start at
// element `offset(b, g, s)` of pk and pv (kv head g, position s). out: (B, heads, D). Query head h reads
// kv head h / (heads / kv_heads), as scaled_dot_product_attention(enable_gqa=True) does; softmax in
// float with the max subtracted first.
template <typename Length, typename Offset>
void attend_new_rows(const float* q, const float* pk, const float* pv, int64_t B, int64_t heads, int64_t kv_heads,
                     int64_t D, int64_t longest, Length length, Offset offset, float* out) {
  const int64_t group = heads / kv_heads;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, longest * D));   // heads per thread
  at::parallel_for(0, B * heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(longest);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / heads, h = row % heads, g = h / group, n = length(b);
      const float* qh = q + row * D;
      float top = -INFINITY;
      for (int64_t s = 0; s < n; ++s) top = std::max(top, scores[s] = dot(qh, pk + offset(b, g, s), D) * scale);
      float total = 0.f;
      for (int64_t s = 0; s < n; ++s) total += scores[s] = std::exp(scores[s] - top);
      float* o = out + row * D;
      for (int64_t d = 0; d < D; ++d) o[d] = 0.f;
      for (int64_t s = 0; s < n; ++s) {
        const float p = scores[s] / total;
        const float* vs = pv + offset(b, g, s);
        for (int64_t d = 0; d < D; ++d) o[d] += p * vs[d];
      }
    }
  });
}

// One linear without bias: w = [weight] (float, (n, k)) through aten, or [packed, scales, mins]
// through the dispatcher to labsupport::w4a8_linear (loaded by quant/w4a8.py before any model
// holds such weights).
at::Tensor linear(const at::Tensor& x, const std::vector<at::Tensor>& w, c10::string_view path) {
  if (w.size() == 1) return at::linear(x, w[0]);
  TORCH_CHECK(w.size() == 3, "decode_block: a linear is [weight] or [packed, scales, mins]");
  static const auto w4a8 = c10::Dispatcher::singleton()
      .findSchemaOrThrow("labsupport::w4a8_linear", "")
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return w4a8.call(x, w[0], w[1], w[2], path);
}

// The layer's first half for one new token per row: norm, the qkv linear, the rotation.
// x: (B, 1, hidden) float32; cos, sin: (B, 1, D). Returns qkv (B, 1, heads + 2 kv_heads, D).
at::Tensor rotated_qkv(const at::Tensor& x, const at::Tensor& attn_norm, const std::vector<at::Tensor>& qkv_w,
                       const at::Tensor& cos, const at::Tensor& sin, int64_t heads, int64_t kv_heads, int64_t D,
                       double eps, c10::string_view path) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 3 && x.size(1) == 1 && x.is_contiguous(),
              "decode_block: x must be a contiguous float32 (B, 1, hidden) tensor");
  auto qkv = linear(rms_norm(x, attn_norm, eps), qkv_w, path).view({x.size(0), 1, heads + 2 * kv_heads, D});
  return rope(qkv, cos, sin, heads + kv_heads);
}

// The layer's second half: x + out(attended), then + mlp(norm(...)), as transformer.py's Block.
at::Tensor finish_block(const at::Tensor& x, const at::Tensor& attended, const at::Tensor& mlp_norm,
                        const std::vector<at::Tensor>& out_w, const std::vector<at::Tensor>& gate_up_w,
                        const std::vector<at::Tensor>& down_w, double eps, c10::string_view path) {
  auto [h, normed] = add_rms_norm(x, linear(attended, out_w, path), mlp_norm, eps);
  auto mlp = linear(silu_mul(linear(normed, gate_up_w, path)), down_w, path);
  return h.add_(mlp);
}

// A static cache. keys, values: this layer's buffers (B, kv_heads, max_len, D), the new token
// written at `start`. Returns the layer's output (B, 1, hidden).
at::Tensor decode_block(const at::Tensor& x, const at::Tensor& attn_norm, const at::Tensor& mlp_norm,
                        std::vector<at::Tensor> qkv_w, std::vector<at::Tensor> out_w,
                        std::vector<at::Tensor> gate_up_w, std::vector<at::Tensor> down_w,
                        const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& keys,
                        const at::Tensor& values, int64_t start, int64_t heads, double eps,
                        c10::string_view path) {
  TORCH_CHECK(keys.scalar_type() == at::kFloat && keys.is_contiguous() && values.is_contiguous() &&
              keys.dim() == 4 && keys.sizes() == values.sizes() && keys.size(0) == x.size(0) &&
              start >= 0 && start < keys.size(2) && heads % keys.size(1) == 0,
              "decode_block: keys and values must be contiguous float32 (B, kv_heads, max_len, D) buffers "
              "with room at `start`");
  const int64_t B = x.size(0), kv_heads = keys.size(1), D = keys.size(3), max_len = keys.size(2);
  auto qkv = rotated_qkv(x, attn_norm, qkv_w, cos, sin, heads, kv_heads, D, eps, path);
  const float* pq = qkv.data_ptr<float>();
  float *pk = keys.data_ptr<float>(), *pv = values.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)                                      // the cache write, at `start`
    for (int64_t g = 0; g < kv_heads; ++g) {
      const float* row = pq + (b * (heads + 2 * kv_heads) + heads + g) * D;
      std::copy(row, row + D, pk + ((b * kv_heads + g) * max_len + start) * D);
      std::copy(row + kv_heads * D, row + (kv_heads + 1) * D, pv + ((b * kv_heads + g) * max_len + start) * D);
    }
  auto queries = qkv.narrow(2, 0, heads).contiguous();                 // (B, 1, heads, D)
  auto attended = at::empty({B, 1, heads * D}, x.options());
  RECORD_FUNCTION("labsupport::attend_one_row", std::vector<c10::IValue>());   // the profiler's "attention"
  attend_new_rows(queries.data_ptr<float>(), pk, pv, B, heads, kv_heads, D, start + 1,
                  [&](int64_t) { return start + 1; },
                  [&](int64_t b, int64_t g, int64_t s) { return ((b * kv_heads + g) * max_len + s) * D; },
                  attended.data_ptr<float>());
  return finish_block(x, attended, mlp_norm, out_w, gate_up_w, down_w, eps, path);
}

// A paged pool (serving/paged_cache.py). keys, values: this layer's pool (slots, kv_heads, D);
// the new token of row b goes to slot write_slots[b]; row b reads its positions 0..lengths[b]-1,
// position p at slot tables[b][p / block_size] * block_size + p % block_size (tables (B, W)).
// Returns the layer's output (B, 1, hidden).
at::Tensor decode_block_paged(const at::Tensor& x, const at::Tensor& attn_norm, const at::Tensor& mlp_norm,
                              std::vector<at::Tensor> qkv_w, std::vector<at::Tensor> out_w,
                              std::vector<at::Tensor> gate_up_w, std::vector<at::Tensor> down_w,
                              const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& keys,
                              const at::Tensor& values, const at::Tensor& write_slots, const at::Tensor& tables,
                              const at::Tensor& lengths, int64_t block_size, int64_t heads, double eps,
                              c10::string_view path) {
  const int64_t B = x.size(0);
  TORCH_CHECK(keys.scalar_type() == at::kFloat && keys.is_contiguous() && values.is_contiguous() &&
              keys.dim() == 3 && keys.sizes() == values.sizes() && heads % keys.size(1) == 0 && block_size > 0,
              "decode_block_paged: keys and values must be contiguous float32 (slots, kv_heads, D) pools");
  TORCH_CHECK(write_slots.scalar_type() == at::kLong && write_slots.numel() == B && tables.scalar_type() == at::kLong &&
              tables.dim() == 2 && tables.size(0) == B && tables.is_contiguous() && lengths.scalar_type() == at::kLong &&
              lengths.numel() == B && write_slots.is_contiguous() && lengths.is_contiguous(),
              "decode_block_paged: write_slots (B,), tables (B, W) and lengths (B,) must be contiguous int64 tensors");
  const int64_t kv_heads = keys.size(1), D = keys.size(2), slots = keys.size(0), W = tables.size(1);
  const int64_t *ps = write_slots.data_ptr<int64_t>(), *pt = tables.data_ptr<int64_t>(), *pn = lengths.data_ptr<int64_t>();
  int64_t longest = 1;
  for (int64_t b = 0; b < B; ++b) {                                    // every slot read or written is in the pool
    TORCH_CHECK(pn[b] >= 1 && pn[b] <= W * block_size && ps[b] >= 0 && ps[b] < slots,
                "decode_block_paged: a row's length or write slot is outside its table or the pool");
    for (int64_t w = 0; w < (pn[b] + block_size - 1) / block_size; ++w)
      TORCH_CHECK(pt[b * W + w] >= 0 && (pt[b * W + w] + 1) * block_size <= slots,
                  "decode_block_paged: a block table names a block outside the pool");
    longest = std::max(longest, pn[b]);
  }
  auto qkv = rotated_qkv(x, attn_norm, qkv_w, cos, sin, heads, kv_heads, D, eps, path);
  const float* pq = qkv.data_ptr<float>();
  float *pk = keys.data_ptr<float>(), *pv = values.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)                                      // the cache write, into its slot
    for (int64_t g = 0; g < kv_heads; ++g) {
      const float* row = pq + (b * (heads + 2 * kv_heads) + heads + g) * D;
      std::copy(row, row + D, pk + (ps[b] * kv_heads + g) * D);
      std::copy(row + kv_heads * D, row + (kv_heads + 1) * D, pv + (ps[b] * kv_heads + g) * D);
    }
  auto queries = qkv.narrow(2, 0, heads).contiguous();                 // (B, 1, heads, D)
  auto attended = at::empty({B, 1, heads * D}, x.options());
  RECORD_FUNCTION("labsupport::attend_one_row", std::vector<c10::IValue>());   // the profiler's "attention"
  attend_new_rows(queries.data_ptr<float>(), pk, pv, B, heads, kv_heads, D, longest,
                  [&](int64_t b) { return pn[b]; },
                  [&](int64_t b, int64_t g, int64_t s) {
                    return ((pt[b * W + s / block_size] * block_size + s % block_size) * kv_heads + g) * D;
                  },
                  attended.data_ptr<float>());
  return finish_block(x, attended, mlp_norm, out_w, gate_up_w, down_w, eps, path);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(labsupport, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rope(Tensor qkv, Tensor cos, Tensor sin, int heads) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("decode_block(Tensor x, Tensor attn_norm, Tensor mlp_norm, Tensor[] qkv, Tensor[] out, Tensor[] gate_up, "
        "Tensor[] down, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, int start, int heads, "
        "float eps, str path) -> Tensor");
  m.def("decode_block_paged(Tensor x, Tensor attn_norm, Tensor mlp_norm, Tensor[] qkv, Tensor[] out, "
        "Tensor[] gate_up, Tensor[] down, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
        "Tensor write_slots, Tensor tables, Tensor lengths, int block_size, int heads, float eps, str path) -> Tensor");
}

TORCH_LIBRARY_IMPL(labsupport, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rope", &rope);
  m.impl("silu_mul", &silu_mul);
  m.impl("decode_block", &decode_block);
  m.impl("decode_block_paged", &decode_block_paged);
}

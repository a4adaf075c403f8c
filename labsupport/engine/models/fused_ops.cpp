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

#include <cmath>
#include <tuple>

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(labsupport, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rope(Tensor qkv, Tensor cos, Tensor sin, int heads) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(labsupport, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rope", &rope);
  m.impl("silu_mul", &silu_mul);
}

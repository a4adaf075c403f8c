// W4A8 linear on the CPU: int4 weights (Q4_1 blocks of 32) times int8 activations.
// Notebook 04 (quantization). Built and loaded by w4a8.py (torch.utils.cpp_extension.load).
//
// The math, for one block of 32 input features of one output row:
//   weight      w_i ~ d * q_i + m         q_i  in 0..15     (d = (max-min)/15, m = min: Q4_1)
//   activation  x_i ~ dx * qx_i           qx_i in -127..127 (dx = max|x| / 127: symmetric int8)
//   sum_i w_i x_i ~ d*dx * sum_i q_i*qx_i  +  m * (dx * sum_i qx_i)
// The first sum is all integers: 32 byte products, the work the SIMD paths do. The second needs
// only sx = dx * sum(qx), computed once per activation block and shared by every output row.
// Each block's integer sum is exact; only the float scale terms round, so the result equals a
// float matmul of the same quantized weights and activations up to float rounding (w4a8_reference).
//
// Weight layout (made once at load by w4a8.py's pack_q4_1), for n rows of k = 32 * nb features:
//   packed (n, k/2) uint8: per row, nb blocks of 16 bytes; byte j = q[j] | q[j+16] << 4
//   scales (n, nb) fp16 (d), mins (n, nb) fp16 (m): two planes beside the nibbles
// Why this layout: a 32-byte load is two whole blocks; `& 0x0F` gives q[0..15] of both and
// `>> 4` gives q[16..31] of both, with no shuffle (llama.cpp's Q4_1 nibble order). The scales
// sit in their own planes, not between the nibbles, so that loads of nibbles stay 32/64-byte
// runs and 8 scales come in one 16-byte load that converts to 8 floats at once (F16C). fp16
// scales are GGUF's choice: 16 + 2 + 2 bytes per 32 weights = 5 bits a weight (fp32: 6).
//
// Activation layout (quantized per call, in the order the chosen path reads): blocks are taken
// in groups of the path's width (1 block for the portable loop, 2 for 256-bit registers, 4 for
// 512-bit ones; the last blocks in smaller groups, halving the width); a group of w blocks holds
// the first 16 values of each of its blocks, then the second 16 of each. One 256-bit load then
// lines up exactly with the low nibbles of two blocks, the next with their high nibbles.
//
// Paths, chosen at run time (`path`: "auto" = the best this CPU runs):
//   portable    plain C++ loop (Arm, old x86; the compiler may vectorize it)
//   avx2        _mm256_maddubs_epi16 (u8 x s8 -> pairs summed in int16), _mm256_madd_epi16 (-> int32)
//   avxvnni     _mm256_dpbusd_avx_epi32: u8 x s8, 4 products summed into int32, one instruction
//   avx512vnni  _mm512_dpbusd_epi32: the same on 512 bits, four blocks per instruction
// From GEMM_MIN_ROWS activation rows (a batch, a prefill) the SIMD paths multiply weight tiles of one
// row per 32-bit lane instead, each unpacked once for all the rows ("many activation rows", below).
// Each SIMD function carries its own __attribute__((target)), so the file builds without
// -march flags and runs anywhere; a path runs only if __builtin_cpu_supports says the CPU has it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

// W4A8_PORTABLE_ONLY compiles the x86 paths out, as on an Arm CPU (a test builds it that way)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(W4A8_PORTABLE_ONLY)
#define W4A8_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define W4A8_X86 0
#endif
// the AVX-VNNI intrinsics arrived in GCC 11 and clang 12
#if W4A8_X86 && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define W4A8_AVXVNNI 1
#else
#define W4A8_AVXVNNI 0
#endif

namespace {

constexpr int64_t BLOCK = 32;           // input features per block (Q4_1 weights, int8 activations)
constexpr int64_t BYTES = BLOCK / 2;    // packed weight bytes per block
constexpr int MAX_ROWS = 4;             // activation rows computed together (the batch tile)
constexpr int WEIGHT_TILE = 4;          // weight rows computed together
constexpr int64_t GEMM_MIN_ROWS = 8;    // from this many activation rows: one weight row per lane (below, README)

enum Path { PORTABLE, AVX2, AVXVNNI, AVX512VNNI, NUM_PATHS };
const int GEMM_TILE[NUM_PATHS] = {0, 8, 8, 16};   // weight rows per such tile (0: the path has none)
const char* const PATH_NAMES[NUM_PATHS] = {"portable", "avx2", "avxvnni", "avx512vnni"};
const int GROUP_WIDTH[NUM_PATHS] = {1, 2, 2, 4};   // blocks per activation group (layout above)

struct WeightRow { const uint8_t* q; const at::Half* d; const at::Half* m; };   // one packed row
struct ActRow { const int8_t* q; const float* dx; const float* sx; };          // one quantized x row

// ---- activations: float row -> int8 blocks in the path's group layout, dx and sx per block ------
// One block: its first 16 values go to `lo`, its second 16 to `hi`. A NaN or an infinity in the
// block makes its dx or sx non-finite (and its qx 0), so every output is NaN, as in a float matmul.
void quantize_block(const float* x, int8_t* lo, int8_t* hi, float* dx, float* sx) {
  float amax = 0.0f;
  bool nan = false;
  for (int i = 0; i < BLOCK; ++i) amax = std::max(amax, std::fabs(x[i])), nan |= std::isnan(x[i]);
  const float d = nan ? NAN : amax / 127.0f, inv = d > 0.0f && d < INFINITY ? 1.0f / d : 0.0f;
  int32_t sum = 0;
  for (int i = 0; i < BLOCK; ++i) {
    // round half to even, as torch.round does: adding and removing 1.5 * 2^23 leaves no fraction
    // bits (exact for |v| < 2^22; -O3 keeps it, only -ffast-math would not). |x * inv| <= 127.
    const int8_t q = inv > 0.0f ? static_cast<int8_t>((x[i] * inv + 12582912.0f) - 12582912.0f) : 0;
    if (i < 16) lo[i] = q; else hi[i - 16] = q;
    sum += q;
  }
  *dx = d;
  *sx = d * static_cast<float>(sum);
}

using QuantizeBlock = void (*)(const float*, int8_t*, int8_t*, float*, float*);

void quantize_row(const float* x, int64_t nb, int width, QuantizeBlock quantize, int8_t* qx, float* dx, float* sx) {
  for (int64_t b = 0, w = width; b < nb; b += w) {
    while (b + w > nb) w /= 2;                               // the last blocks: smaller groups
    for (int64_t g = 0; g < w; ++g)                          // block b + g, the g-th of its group
      quantize(x + BLOCK * (b + g), qx + BLOCK * b + 16 * g, qx + BLOCK * b + 16 * (w + g), dx + b + g, sx + b + g);
  }
}

// ---- portable: one block at a time ---------------------------------------------------------------
// x_lo / x_hi: the block's first and second 16 activations (where they lie depends on the layout)
inline int32_t block_dot(const uint8_t* q, const int8_t* x_lo, const int8_t* x_hi) {
  int32_t lo = 0, hi = 0;
  for (int j = 0; j < 16; ++j) lo += static_cast<int16_t>(q[j] & 0x0F) * static_cast<int16_t>(x_lo[j]);
  for (int j = 0; j < 16; ++j) hi += static_cast<int16_t>(q[j] >> 4) * static_cast<int16_t>(x_hi[j]);
  return lo + hi;
}

// Block b's float contribution when it is alone in its group (the last of an odd count, or width 1).
inline float single_block(const WeightRow& w, const ActRow& a, int64_t b) {
  const int8_t* x = a.q + BLOCK * b;
  return static_cast<float>(w.d[b]) * a.dx[b] * static_cast<float>(block_dot(w.q + BYTES * b, x, x + 16)) +
         static_cast<float>(w.m[b]) * a.sx[b];
}

// A tile kernel: W weight rows times R activation rows over nb blocks; out[r * n + i] = row i . x r
template <int W, int R>
void tile_portable(const WeightRow* w, const ActRow* a, int64_t nb, float* out, int64_t n) {
  for (int i = 0; i < W; ++i) {
    float acc[R] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const float d = static_cast<float>(w[i].d[b]), m = static_cast<float>(w[i].m[b]);   // once per block
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a[r].q + BLOCK * b;                // width 1: natural order
        acc[r] += d * a[r].dx[b] * static_cast<float>(block_dot(w[i].q + BYTES * b, x, x + 16)) + m * a[r].sx[b];
      }
    }
    for (int r = 0; r < R; ++r) out[r * n + i] = acc[r];
  }
}

#if W4A8_X86
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// The activations' quantization, 8 floats at a time (identical results to quantize_block:
// the same float operations, and _mm256_cvtps_epi32 rounds half to even by default).
TARGET_AVX2 void quantize_block_avx2(const float* x, int8_t* lo, int8_t* hi, float* dx, float* sx) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax8 = _mm256_setzero_ps(), nan8 = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_loadu_ps(x + 8 * j);
    amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, v[j]));
    nan8 = _mm256_or_ps(nan8, _mm256_cmp_ps(v[j], v[j], _CMP_UNORD_Q));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  const float d = _mm256_movemask_ps(nan8) ? NAN : amax / 127.0f, inv = d > 0.0f && d < INFINITY ? 1.0f / d : 0.0f;
  __m256i q[4];
  for (int j = 0; j < 4; ++j)
    q[j] = inv > 0.0f ? _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(inv))) : _mm256_setzero_si256();
  // 32 int32 -> 32 int8: the packs interleave 128-bit lanes; the permute puts them back in order
  __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lo), _mm256_castsi256_si128(bytes));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(hi), _mm256_extracti128_si256(bytes, 1));
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  *dx = d;
  *sx = d * static_cast<float>(_mm_cvtsi128_si32(s4));
}

// ---- helpers shared by the x86 paths (an AVX2 helper inlines into any wider target) ------------
TARGET_AVX2 inline __m256 load8_half(const at::Half* p) {          // 8 fp16 scales -> 8 floats
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
TARGET_AVX2 inline __m256 pair_products(const at::Half* p, const float* f) {   // [p0*f0, p1*f1, 0, ...]
  int32_t two;
  std::memcpy(&two, p, sizeof two);
  const __m128 f2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(f)));
  return _mm256_zextps128_ps256(_mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(two)), f2));
}
// lanes 0-3 get s8[2p], lanes 4-7 get s8[2p+1]: the factors of pair p, laid over its int32 sums
TARGET_AVX2 inline __m256 pair_scale(__m256 s8, int p) {
  return _mm256_permutevar8x32_ps(s8, _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p,
                                                         2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1));
}
TARGET_AVX2 inline float hsum(__m256 v) {                          // the 8 lanes' sum
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
// out[r * n + i] = the lanes' sum of v[i][r] (+ a last odd block); four rows at once by transposing adds
template <int W, int R>
TARGET_AVX2 inline void store_sums(__m256 (&v)[W][R], const WeightRow* w, const ActRow* a, int64_t nb, float* out, int64_t n) {
  for (int r = 0; r < R; ++r) {
    float sums[W];
    if constexpr (W == 4) {
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v[0][r], v[1][r]), _mm256_hadd_ps(v[2][r], v[3][r]));
      _mm_storeu_ps(sums, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    } else {
      for (int i = 0; i < W; ++i) sums[i] = hsum(v[i][r]);
    }
    for (int i = 0; i < W; ++i) out[r * n + i] = sums[i] + (nb % 2 ? single_block(w[i], a[r], nb - 1) : 0.0f);
  }
}

// Each 256-bit path walks its tile of rows the same way:
//   8 blocks at a time: 8 scales d (one load) times the 8 dx give the 8 factors d*dx, and the
//     min term of the 8 blocks is one FMA (m * sx); then 4 pairs of blocks: each pair's int32 sums
//     (4 lanes per block) are converted to float and FMA'd with their factors (`pair_scale`);
//   then the pairs left (fewer than 8 blocks), their factors from 2-scale loads (`pair_products`);
//   then a last odd block, in scalar code (`store_sums`).
// The nibbles of a weight row are unpacked once for the R activation rows; the activations are
// loaded once for the W weight rows; W * R accumulators (the min term goes into the same one)
// make independent chains of FMAs.
#define W4A8_TILE_256(NAME, TARGET, PAIR_SUMS)                                                     \
  template <int W, int R>                                                                          \
  TARGET inline void NAME##_pair(const WeightRow* w, const ActRow* a, int64_t b, const __m256 (&s)[W][R], \
                                 __m256 (&acc)[W][R]) {                                            \
    const __m256i low4 = _mm256_set1_epi8(0x0F);                                                   \
    for (int i = 0; i < W; ++i) {                                                                  \
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].q + BYTES * b)); \
      const __m256i lo = _mm256_and_si256(bytes, low4);                        /* q[0..15], 2 blocks */ \
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);  /* q[16..31] */     \
      for (int r = 0; r < R; ++r) {                                                                \
        const __m256i* x = reinterpret_cast<const __m256i*>(a[r].q + BLOCK * b);                   \
        const __m256i sums = PAIR_SUMS(lo, hi, _mm256_loadu_si256(x), _mm256_loadu_si256(x + 1));  \
        acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), s[i][r], acc[i][r]);                 \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  template <int W, int R>                                                                          \
  TARGET void NAME(const WeightRow* w, const ActRow* a, int64_t nb, float* out, int64_t n) {       \
    __m256 acc[W][R], s8[W][R], s[W][R];                                                           \
    for (int i = 0; i < W; ++i)                                                                    \
      for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();                                 \
    int64_t b = 0;                                                                                 \
    for (; b + 8 <= nb; b += 8) {                                                                  \
      for (int i = 0; i < W; ++i) {                                                                \
        const __m256 d8 = load8_half(w[i].d + b), m8 = load8_half(w[i].m + b);                     \
        for (int r = 0; r < R; ++r) {                                                              \
          s8[i][r] = _mm256_mul_ps(d8, _mm256_loadu_ps(a[r].dx + b));                              \
          acc[i][r] = _mm256_fmadd_ps(m8, _mm256_loadu_ps(a[r].sx + b), acc[i][r]);                \
        }                                                                                          \
      }                                                                                            \
      for (int p = 0; p < 4; ++p) {                                                                \
        for (int i = 0; i < W; ++i)                                                                \
          for (int r = 0; r < R; ++r) s[i][r] = pair_scale(s8[i][r], p);                           \
        NAME##_pair<W, R>(w, a, b + 2 * p, s, acc);                                                \
      }                                                                                            \
    }                                                                                              \
    for (; b + 2 <= nb; b += 2) {                                                                  \
      for (int i = 0; i < W; ++i)                                                                  \
        for (int r = 0; r < R; ++r) {                                                              \
          s[i][r] = pair_scale(pair_products(w[i].d + b, a[r].dx + b), 0);                         \
          acc[i][r] = _mm256_add_ps(acc[i][r], pair_products(w[i].m + b, a[r].sx + b));            \
        }                                                                                          \
      NAME##_pair<W, R>(w, a, b, s, acc);                                                          \
    }                                                                                              \
    store_sums<W, R>(acc, w, a, nb, out, n);                                                       \
  }

// AVX2: u8 x s8 products summed in pairs into int16 (at most 2 * 15 * 127 each, twice: no
// overflow), then pairs of int16 summed into int32 by a multiply with ones.
TARGET_AVX2 inline __m256i pair_sums_avx2(__m256i lo, __m256i hi, __m256i x_lo, __m256i x_hi) {
  const __m256i int16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_lo), _mm256_maddubs_epi16(hi, x_hi));
  return _mm256_madd_epi16(int16, _mm256_set1_epi16(1));
}
W4A8_TILE_256(tile_avx2, TARGET_AVX2, pair_sums_avx2)

#if W4A8_AVXVNNI
// AVX-VNNI: 4 u8 x s8 products summed straight into each int32 lane
TARGET_AVXVNNI inline __m256i pair_sums_avxvnni(__m256i lo, __m256i hi, __m256i x_lo, __m256i x_hi) {
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, x_lo), hi, x_hi);
}
W4A8_TILE_256(tile_avxvnni, TARGET_AVXVNNI, pair_sums_avxvnni)
#endif

// ---- AVX512-VNNI: 4 blocks per instruction -------------------------------------------------------
// The same walk with 16 blocks a step (4 quads: group width 4), then 1-3 quads more with masked
// scale loads, then a pair in 256 bits (AVX512-VL), then a last odd block in scalar code.
TARGET_AVX512 inline __m512 load16_half(const at::Half* p, __mmask16 mask) {   // fp16 -> float, 0 where masked
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
}
// lanes 4j..4j+3 get s16[4c + j]: the factors d*dx of quad c, laid over its int32 sums
TARGET_AVX512 inline __m512 quad_scale(__m512 s16, int c) {
  const __m512i index = _mm512_setr_epi32(4 * c, 4 * c, 4 * c, 4 * c, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1,
                                          4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3);
  return _mm512_permutexvar_ps(index, s16);
}
// `quads` quads from block b: the 16 factors and the min term come with one (masked) load each
template <int W, int R>
TARGET_AVX512 inline void quad_steps(const WeightRow* w, const ActRow* a, int64_t b, int quads,
                                     __m512 (&acc)[W][R]) {
  const __mmask16 mask = static_cast<__mmask16>((1u << (4 * quads)) - 1);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 s16[W][R];
  for (int i = 0; i < W; ++i) {
    const __m512 d16 = load16_half(w[i].d + b, mask), m16 = load16_half(w[i].m + b, mask);
    for (int r = 0; r < R; ++r) {
      s16[i][r] = _mm512_mul_ps(d16, _mm512_maskz_loadu_ps(mask, a[r].dx + b));
      acc[i][r] = _mm512_fmadd_ps(m16, _mm512_maskz_loadu_ps(mask, a[r].sx + b), acc[i][r]);
    }
  }
  for (int c = 0; c < quads; ++c) {
    for (int i = 0; i < W; ++i) {
      const __m512i bytes = _mm512_loadu_si512(w[i].q + BYTES * (b + 4 * c));
      const __m512i lo = _mm512_and_si512(bytes, low4), hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low4);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a[r].q + BLOCK * (b + 4 * c);
        const __m512i sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(x)),
                                                 hi, _mm512_loadu_si512(x + 64));
        acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), quad_scale(s16[i][r], c), acc[i][r]);
      }
    }
  }
}

template <int W, int R>
TARGET_AVX512 void tile_avx512vnni(const WeightRow* w, const ActRow* a, int64_t nb, float* out, int64_t n) {
  __m512 acc[W][R];
  for (int i = 0; i < W; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 16 <= nb; b += 16) quad_steps<W, R>(w, a, b, 4, acc);
  if (b + 4 <= nb) {
    quad_steps<W, R>(w, a, b, static_cast<int>((nb - b) / 4), acc);
    b += 4 * ((nb - b) / 4);
  }
  __m256 sum[W][R];                                            // 512 -> 256 bits, then a pair
  for (int i = 0; i < W; ++i)
    for (int r = 0; r < R; ++r) {
      const __m512 v = acc[i][r];
      sum[i][r] = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    }
  if (b + 2 <= nb) {                                           // a pair (group width 2)
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < W; ++i) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].q + BYTES * b));
      const __m256i lo = _mm256_and_si256(bytes, low4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
      for (int r = 0; r < R; ++r) {
        const __m256i* x = reinterpret_cast<const __m256i*>(a[r].q + BLOCK * b);
        const __m256i sums = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, _mm256_loadu_si256(x)),
                                                 hi, _mm256_loadu_si256(x + 1));
        sum[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), pair_scale(pair_products(w[i].d + b, a[r].dx + b), 0),
                                    _mm256_add_ps(sum[i][r], pair_products(w[i].m + b, a[r].sx + b)));
      }
    }
  }
  store_sums<W, R>(sum, w, a, nb, out, n);
}

// ---- many activation rows: each weight block unpacked once, for every row ----------------------
// The tiles above unpack a weight row's nibbles for at most 4 activation rows, and spend 3
// instructions on scales (convert, permute, FMA) for every 2 dot-product instructions: with many
// rows (a batch of 8 or more, a prefill) that work, not memory, is the cost. Here a tile is one
// weight row per 32-bit lane (16 rows in 512 bits, 8 in 256), unpacked once per call into this
// layout (`unpack_tile`):
//   per block b and 4-byte group g (8 of them, 32 weights): a vector whose lane j holds row j's
//   weights 4g..4g+3 as bytes; and the tile's scales d and mins m of block b as floats.
// Then one activation row's block is 8 dot-product instructions, each multiplying every row of the
// tile by 4 of its bytes broadcast to every lane, and one FMA applies all the rows' scales at once.
// The activations are read in natural order (group width 1). A row's result does not depend on
// the batch's other rows, but it is rounded differently from the tiles' (the sums are added in
// another order): below GEMM_MIN_ROWS rows the tiles are used, so results differ by float rounding
// (about 1e-7 of the terms' size) between a batch of 7 rows and one of 8.

// The tile's scales and mins as floats, lane order: F16C (c10::Half's own conversion is ~20
// integer instructions); rows past n get 0, so their lanes add nothing.
TARGET_AVX2 inline void tile_scales(const at::Half* d, const at::Half* m, int64_t nb, int64_t b, int rows, int tile,
                                    float* wd, float* wm) {
  for (int j = 0; j < tile; ++j) {
    wd[tile * b + j] = j < rows ? _cvtsh_ss(d[j * nb + b].x) : 0.0f;
    wm[tile * b + j] = j < rows ? _cvtsh_ss(m[j * nb + b].x) : 0.0f;
  }
}
alignas(16) const uint8_t ZERO_BLOCK[BYTES] = {};                        // stands for the rows past n
inline const uint8_t* tile_block(const uint8_t* q, int64_t nb, int64_t b, int j, int rows) {   // row j's block b
  return j < rows ? q + j * nb * BYTES + BYTES * b : ZERO_BLOCK;
}

// 512 bits, the scales: 16 blocks of the tile's 16 rows at a time, converted (F16C) and transposed
// in registers, so that lane j of block b's vector is row j's scale: in each of 4 stages (s = 8, 4,
// 2, 1) rows i and i + s swap their off-diagonal s x s blocks, one two-vector permute per row.
TARGET_AVX512 void transpose16(__m512 (&r)[16]) {
  for (int s = 8; s >= 1; s /= 2) {
    alignas(64) int32_t keep[16], take[16];          // lane c of the new rows i and i + s
    for (int c = 0; c < 16; ++c) {
      keep[c] = c & s ? 16 + c - s : c;              // row i: its own column c, or row i+s's c - s
      take[c] = c & s ? 16 + c : c + s;              // row i+s: its own column c, or row i's c + s
    }
    const __m512i to_keep = _mm512_load_si512(keep), to_take = _mm512_load_si512(take);
    for (int i = 0; i < 16; ++i) {
      if (i & s) continue;
      const __m512 low = _mm512_permutex2var_ps(r[i], to_keep, r[i + s]);
      r[i + s] = _mm512_permutex2var_ps(r[i], to_take, r[i + s]);
      r[i] = low;
    }
  }
}
TARGET_AVX512 void tile_scales16(const at::Half* d, const at::Half* m, int64_t nb, int rows, float* wd, float* wm) {
  int64_t b = 0;
  for (; b + 16 <= nb; b += 16)
    for (auto [from, to] : {std::pair{d, wd}, std::pair{m, wm}}) {
      __m512 r[16];                                  // r[j]: row j's 16 scales; then r[c]: block b + c's 16 rows
      for (int j = 0; j < 16; ++j)
        r[j] = j < rows ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + j * nb + b)))
                        : _mm512_setzero_ps();
      transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_storeu_ps(to + 16 * (b + c), r[c]);
    }
  for (; b < nb; ++b) tile_scales(d, m, nb, b, rows, 16, wd, wm);   // the last nb % 16 blocks
}

// 512 bits: a 16 x 16 byte transpose by 4-byte columns, without gathers (slow on CPUs patched
// against "Downfall": about 40 cycles each, measured here): load 4 rows per vector (one per 128-bit
// lane), put each lane's column c in the lane's dwords (permute), then swap 128-bit lanes across vectors.
TARGET_AVX512 void unpack_tile16(const uint8_t* q, const at::Half* d, const at::Half* m, int64_t nb, int rows,
                                 uint8_t* wq, float* wd, float* wm) {
  const __m512i by_column = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    auto block = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile_block(q, nb, b, j, rows))); };
    __m512i a[4];                                             // a[t]: rows 4t..4t+3, lane i = row 4t+i
    for (int t = 0; t < 4; ++t) {
      __m512i v = _mm512_castsi128_si512(block(4 * t));
      v = _mm512_inserti32x4(v, block(4 * t + 1), 1);
      v = _mm512_inserti32x4(v, block(4 * t + 2), 2);
      v = _mm512_inserti32x4(v, block(4 * t + 3), 3);
      a[t] = _mm512_permutexvar_epi32(by_column, v);          // lane c = column c of rows 4t..4t+3
    }
    const __m512i t0 = _mm512_shuffle_i32x4(a[0], a[1], _MM_SHUFFLE(1, 0, 1, 0));   // a0.l0 a0.l1 a1.l0 a1.l1
    const __m512i t1 = _mm512_shuffle_i32x4(a[0], a[1], _MM_SHUFFLE(3, 2, 3, 2));   // a0.l2 a0.l3 a1.l2 a1.l3
    const __m512i t2 = _mm512_shuffle_i32x4(a[2], a[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i t3 = _mm512_shuffle_i32x4(a[2], a[3], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i column[4] = {_mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0)),   // lane j = row j's bytes 4c..4c+3
                               _mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1)),
                               _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1))};
    for (int c = 0; c < 4; ++c) {            // low nibbles = q[4c..4c+3], high nibbles = q[16+4c..]
      _mm512_storeu_si512(wq + 64 * (8 * b + c), _mm512_and_si512(column[c], low4));
      _mm512_storeu_si512(wq + 64 * (8 * b + 4 + c), _mm512_and_si512(_mm512_srli_epi16(column[c], 4), low4));
    }
  }
  tile_scales16(d, m, nb, rows, wd, wm);
}

// 256 bits, the scales: 8 blocks of the tile's 8 rows at a time, the classic 8 x 8 transpose
// (interleave pairs of rows, then pairs of pairs, then swap 128-bit halves)
TARGET_AVX2 void transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      u[i + 2 * h] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[i + 2 * h + 1] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
TARGET_AVX2 void tile_scales8(const at::Half* d, const at::Half* m, int64_t nb, int rows, float* wd, float* wm) {
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8)
    for (auto [from, to] : {std::pair{d, wd}, std::pair{m, wm}}) {
      __m256 r[8];                                   // r[j]: row j's 8 scales; then r[c]: block b + c's 8 rows
      for (int j = 0; j < 8; ++j) r[j] = j < rows ? load8_half(from + j * nb + b) : _mm256_setzero_ps();
      transpose8(r);
      for (int c = 0; c < 8; ++c) _mm256_storeu_ps(to + 8 * (b + c), r[c]);
    }
  for (; b < nb; ++b) tile_scales(d, m, nb, b, rows, 8, wd, wm);     // the last nb % 8 blocks
}

// 256 bits: the 8 x 16 byte transpose, rows t and t+4 in one vector, then the in-lane 4 x 4 dword
// transpose of unpack 32-bit then 64-bit pairs
TARGET_AVX2 void unpack_tile8(const uint8_t* q, const at::Half* d, const at::Half* m, int64_t nb, int rows,
                              uint8_t* wq, float* wd, float* wm) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    auto block = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile_block(q, nb, b, j, rows))); };
    __m256i a[4];                                             // a[t]: row t | row t + 4
    for (int t = 0; t < 4; ++t) a[t] = _mm256_inserti128_si256(_mm256_castsi128_si256(block(t)), block(t + 4), 1);
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);   // r0c0 r1c0 r0c1 r1c1 | r4.. r5..
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    const __m256i column[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),   // lane j = row j's bytes 4c..
                               _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    for (int c = 0; c < 4; ++c) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wq + 32 * (8 * b + c)), _mm256_and_si256(column[c], low4));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wq + 32 * (8 * b + 4 + c)),
                          _mm256_and_si256(_mm256_srli_epi16(column[c], 4), low4));
    }
  }
  tile_scales8(d, m, nb, rows, wd, wm);
}

// The block's 8 groups against one activation row: group g < 4 holds low nibbles q[4g..4g+3], group
// g >= 4 high nibbles q[16+4(g-4)..]; both meet the activation bytes x[4g..4g+3] (natural order).
inline int32_t four_bytes(const int8_t* x) { int32_t v; std::memcpy(&v, x, 4); return v; }
TARGET_AVX512 inline __m512i block_sums16(const uint8_t* w, const int8_t* x) {           // int32 x 16 rows
  __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();     // two chains of 4 dependent adds
  for (int g = 0; g < 4; ++g) {
    lo = _mm512_dpbusd_epi32(lo, _mm512_loadu_si512(w + 64 * g), _mm512_set1_epi32(four_bytes(x + 4 * g)));
    hi = _mm512_dpbusd_epi32(hi, _mm512_loadu_si512(w + 64 * (4 + g)), _mm512_set1_epi32(four_bytes(x + 16 + 4 * g)));
  }
  return _mm512_add_epi32(lo, hi);
}
// AVX2: pairs of u8 x s8 products summed into int16 (each at most 2 * 15 * 127; all 8 groups: 30480,
// no overflow), then pairs of int16 into int32 by a multiply with ones
TARGET_AVX2 inline __m256i block_sums8_avx2(const uint8_t* w, const int8_t* x) {         // int32 x 8 rows
  __m256i sum16 = _mm256_setzero_si256();
  for (int g = 0; g < 8; ++g)
    sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * g)),
                                                         _mm256_set1_epi32(four_bytes(x + 4 * g))));
  return _mm256_madd_epi16(sum16, _mm256_set1_epi16(1));
}
#if W4A8_AVXVNNI
TARGET_AVXVNNI inline __m256i block_sums8_avxvnni(const uint8_t* w, const int8_t* x) {
  __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
  for (int g = 0; g < 4; ++g) {
    lo = _mm256_dpbusd_avx_epi32(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * g)),
                                 _mm256_set1_epi32(four_bytes(x + 4 * g)));
    hi = _mm256_dpbusd_avx_epi32(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * (4 + g))),
                                 _mm256_set1_epi32(four_bytes(x + 16 + 4 * g)));
  }
  return _mm256_add_epi32(lo, hi);
}
#endif

// R activation rows times an unpacked tile: out[r * n + j] for the tile's `rows` rows j. Per block
// and row: the block's sums, then one FMA with the rows' d times the row's dx, one with m times sx.
template <int R>
TARGET_AVX512 void gemm_tile16(const uint8_t* wq, const float* wd, const float* wm, const ActRow* a, int64_t nb,
                               int rows, float* out, int64_t n) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 d16 = _mm512_loadu_ps(wd + 16 * b), m16 = _mm512_loadu_ps(wm + 16 * b);
    for (int r = 0; r < R; ++r) {
      const __m512 sums = _mm512_cvtepi32_ps(block_sums16(wq + 64 * 8 * b, a[r].q + BLOCK * b));
      acc[r] = _mm512_fmadd_ps(sums, _mm512_mul_ps(d16, _mm512_set1_ps(a[r].dx[b])), acc[r]);
      acc[r] = _mm512_fmadd_ps(m16, _mm512_set1_ps(a[r].sx[b]), acc[r]);
    }
  }
  const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * n, valid, acc[r]);
}
#define W4A8_GEMM_256(NAME, TARGET, BLOCK_SUMS)                                                      \
  template <int R>                                                                                 \
  TARGET void NAME(const uint8_t* wq, const float* wd, const float* wm, const ActRow* a, int64_t nb, \
                   int rows, float* out, int64_t n) {                                              \
    __m256 acc[R];                                                                                 \
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();                                      \
    for (int64_t b = 0; b < nb; ++b) {                                                             \
      const __m256 d8 = _mm256_loadu_ps(wd + 8 * b), m8 = _mm256_loadu_ps(wm + 8 * b);             \
      for (int r = 0; r < R; ++r) {                                                                \
        const __m256 sums = _mm256_cvtepi32_ps(BLOCK_SUMS(wq + 32 * 8 * b, a[r].q + BLOCK * b));   \
        acc[r] = _mm256_fmadd_ps(sums, _mm256_mul_ps(d8, _mm256_set1_ps(a[r].dx[b])), acc[r]);     \
        acc[r] = _mm256_fmadd_ps(m8, _mm256_set1_ps(a[r].sx[b]), acc[r]);                          \
      }                                                                                            \
    }                                                                                              \
    const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); \
    for (int r = 0; r < R; ++r) _mm256_maskstore_ps(out + r * n, valid, acc[r]);                 \
  }
W4A8_GEMM_256(gemm_tile8_avx2, TARGET_AVX2, block_sums8_avx2)
#if W4A8_AVXVNNI
W4A8_GEMM_256(gemm_tile8_avxvnni, TARGET_AVXVNNI, block_sums8_avxvnni)
#endif
#endif  // W4A8_X86

// ---- which paths this CPU runs, and the table of row kernels -----------------------------------
#if W4A8_X86
// One CPUID feature bit (for the features older compilers' __builtin_cpu_supports does not know)
bool cpuid_bit(unsigned leaf, unsigned subleaf, int reg, int bit) {
  unsigned r[4] = {};
  return __get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3]) && ((r[reg] >> bit) & 1);
}
#endif

bool cpu_runs(Path p) {
  if (p == PORTABLE) return true;
#if W4A8_X86
  __builtin_cpu_init();   // __builtin_cpu_supports also checks that the OS saves the wide registers
  const bool f16c = cpuid_bit(1, 0, 2, 29), avx_vnni = cpuid_bit(7, 1, 0, 4);   // ECX bit 29; EAX bit 4
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  if (p == AVX2) return avx2;
  if (p == AVXVNNI) return W4A8_AVXVNNI && avx2 && avx_vnni;
  if (p == AVX512VNNI)
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
  return false;
}

// The tiles: 1 or 4 weight rows x 1, 2, 3 or 4 activation rows.
using TileFn = void (*)(const WeightRow*, const ActRow*, int64_t, float*, int64_t);
#define W4A8_TILES(NAME) {{NAME<1, 1>, NAME<1, 2>, NAME<1, 3>, NAME<1, 4>}, \
                          {NAME<WEIGHT_TILE, 1>, NAME<WEIGHT_TILE, 2>, NAME<WEIGHT_TILE, 3>, NAME<WEIGHT_TILE, 4>}}
const TileFn KERNELS[NUM_PATHS][2][MAX_ROWS] = {
    W4A8_TILES(tile_portable),
#if W4A8_X86
    W4A8_TILES(tile_avx2),
#else
    {},
#endif
#if W4A8_AVXVNNI
    W4A8_TILES(tile_avxvnni),
#else
    {},
#endif
#if W4A8_X86
    W4A8_TILES(tile_avx512vnni),
#else
    {},
#endif
};

// The many-row kernels: how each path unpacks a tile, and multiplies it by 1-4 activation rows.
using UnpackFn = void (*)(const uint8_t*, const at::Half*, const at::Half*, int64_t, int, uint8_t*, float*, float*);
using GemmFn = void (*)(const uint8_t*, const float*, const float*, const ActRow*, int64_t, int, float*, int64_t);
#define W4A8_GEMMS(NAME) {NAME<1>, NAME<2>, NAME<3>, NAME<4>}
#if W4A8_X86
const UnpackFn UNPACK[NUM_PATHS] = {nullptr, unpack_tile8, W4A8_AVXVNNI ? unpack_tile8 : nullptr, unpack_tile16};
const GemmFn GEMMS[NUM_PATHS][MAX_ROWS] = {
    {}, W4A8_GEMMS(gemm_tile8_avx2),
#if W4A8_AVXVNNI
    W4A8_GEMMS(gemm_tile8_avxvnni),
#else
    {},
#endif
    W4A8_GEMMS(gemm_tile16)};
#endif

const std::vector<bool>& runnable() {               // computed once: the CPU does not change
  static const std::vector<bool> ok = [] {
    std::vector<bool> v(NUM_PATHS);
    for (int p = 0; p < NUM_PATHS; ++p) v[p] = KERNELS[p][0][0] != nullptr && cpu_runs(Path(p));
    return v;
  }();
  return ok;
}

std::vector<std::string> w4a8_paths() {              // the paths this CPU runs, best last
  std::vector<std::string> names;
  for (int p = 0; p < NUM_PATHS; ++p)
    if (runnable()[p]) names.emplace_back(PATH_NAMES[p]);
  return names;
}

Path choose_path(c10::string_view name) {
  // "auto": 512-bit VNNI, then AVX-VNNI, then AVX2, then the portable loop
  if (name == "auto") {
    for (int p = NUM_PATHS - 1; p > 0; --p)
      if (runnable()[p]) return Path(p);
    return PORTABLE;
  }
  for (int p = 0; p < NUM_PATHS; ++p) {
    if (name != PATH_NAMES[p]) continue;
    TORCH_CHECK(runnable()[p], "The W4A8 path '", PATH_NAMES[p], "' cannot run on this CPU; it runs ",
                c10::Join(", ", w4a8_paths()), ".");
    return Path(p);
  }
  TORCH_CHECK(false, "Unknown W4A8 path '", std::string(name), "'; use auto, portable, avx2, avxvnni or avx512vnni.");
  return PORTABLE;                                   // not reached: TORCH_CHECK(false) throws
}

// Work per parallel task, in (weight block x activation row) units (4096 blocks = 80 KB of
// weights): below it, waking and joining a thread (about a microsecond) costs more than it saves.
// Measured on an EPYC at batch 1: 2 threads win from about 8000 blocks (576 x 576: 6.1 -> 4.9 us).
constexpr int64_t MIN_TASK_WORK = 4096;

// Software prefetch of the rows `PREFETCH_BYTES` of nibbles ahead of those being computed: the
// hardware prefetchers alone left a decode step's weights streaming at about half the speed.
// SmolLM2-135M's 121 layers (84 MB) one after the other, one thread on an EPYC (CPU time, a busy
// machine): no prefetch 5.7 ms; 4 / 8 / 12 / 16 KB ahead: 3.3-3.9 / 3.0-3.3 / 3.8 / 3.7 ms.
constexpr int64_t PREFETCH_BYTES = 8192;

inline void prefetch_rows(const uint8_t* q, const at::Half* d, const at::Half* m, int64_t nb, int64_t row, int64_t rows) {
  const char* nibbles = reinterpret_cast<const char*>(q + row * nb * BYTES);
  for (int64_t offset = 0; offset < rows * nb * BYTES; offset += 64) __builtin_prefetch(nibbles + offset);
  const char* d_bytes = reinterpret_cast<const char*>(d + row * nb);
  const char* m_bytes = reinterpret_cast<const char*>(m + row * nb);
  for (int64_t offset = 0; offset < rows * nb * 2; offset += 64) __builtin_prefetch(d_bytes + offset), __builtin_prefetch(m_bytes + offset);
}

// y (..., n) = x (..., k) @ W.T, W the packed Q4_1 weight (n, k)
at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& mins, c10::string_view path) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu() && scales.device().is_cpu() && mins.device().is_cpu(),
              "w4a8_linear runs on the CPU; move x and the packed weight to the CPU.");
  TORCH_CHECK(x.is_floating_point() && x.dim() >= 1, "w4a8_linear needs a floating-point x of shape (..., k), got ",
              x.scalar_type(), " with ", x.dim(), " dimensions.");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.size(1) % BYTES == 0 && packed.size(1) > 0,
              "w4a8_linear needs the packed weight from pack_q4_1 (uint8, shape (n, k/2), k a multiple of 32).");
  const int64_t n = packed.size(0), nb = packed.size(1) / BYTES, k = nb * BLOCK;
  for (const at::Tensor* t : {&scales, &mins})
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->dim() == 2 && t->size(0) == n && t->size(1) == nb,
                "w4a8_linear needs scales and mins from pack_q4_1 (float16, shape (", n, ", ", nb, ")), got ",
                t->scalar_type(), " ", t->sizes(), ".");
  TORCH_CHECK(x.size(-1) == k, "x has ", x.size(-1), " input features but the packed weight has ", k,
              (x.size(-1) % BLOCK ? "; pad x with zeros to the weight's padded width (k must be a multiple of 32)." : "."));
  TORCH_CHECK(packed.is_contiguous() && scales.is_contiguous() && mins.is_contiguous(),
              "w4a8_linear needs the packed weight, scales and mins contiguous, as pack_q4_1 returns them.");
  const Path p = choose_path(path);

  // x as contiguous float32 rows of k (M = all its leading dimensions): no copy, and no dispatcher
  // call, when it is one already; y is allocated in x's shape (..., n) straight away
  const at::Tensor x2 = x.scalar_type() == at::kFloat && x.is_contiguous() ? x : x.to(at::kFloat).contiguous();
  const int64_t M = x2.numel() / k;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor y = at::empty(shape, x2.options());                            // (..., n) float32
  auto result = [&] { return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type()); };
  if (M == 0 || n == 0) return result();

  // many rows on a SIMD path: the tiles that unpack each weight block once for every row (above)
#if W4A8_X86
  const bool gemm = p != PORTABLE && M >= GEMM_MIN_ROWS;
#else
  const bool gemm = false;
#endif

  // 1. quantize every activation row once (shared by all n output rows)
  std::vector<int8_t> xq(M * k);
  std::vector<float> dx(M * nb), sx(M * nb);
#if W4A8_X86
  const QuantizeBlock quantize = p == PORTABLE ? quantize_block : quantize_block_avx2;
#else
  const QuantizeBlock quantize = quantize_block;
#endif
  for (int64_t i = 0; i < M; ++i)
    quantize_row(x2.data_ptr<float>() + i * k, nb, gemm ? 1 : GROUP_WIDTH[p], quantize, xq.data() + i * k, dx.data() + i * nb,
                 sx.data() + i * nb);

  // 2. output rows in parallel (torch's intra-op threads), in tiles of 4 weight rows (1 for the
  // last n % 4) x up to MAX_ROWS activation rows. With more activation rows than that, a tile's
  // weights are read from memory once, then again from L1 (4 x k/2 bytes) for each further
  // group of activation rows, and their nibbles unpacked again each time: the cost of this
  // simple loop, which makes large batches (a long prompt's prefill) compute-bound.
  const uint8_t* q = packed.data_ptr<uint8_t>();
  const at::Half* d = scales.data_ptr<at::Half>();
  const at::Half* m = mins.data_ptr<at::Half>();
  float* out = y.data_ptr<float>();
  // Threads split the work at whole tiles (of WEIGHT_TILE rows), so that every row is computed
  // the same way whatever the thread count: the results are bitwise identical.
#if W4A8_X86
  if (gemm) {
    const int tile = GEMM_TILE[p];
    const int64_t tiles = (n + tile - 1) / tile;
    at::parallel_for(0, tiles, std::max<int64_t>(1, MIN_TASK_WORK / (nb * M * tile)), [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> wq(nb * BLOCK * tile);              // one tile unpacked, reused for every row
      std::vector<float> wd(nb * tile), wm(nb * tile);
      ActRow acts[MAX_ROWS];
      for (int64_t t = begin; t < end; ++t) {
        const int64_t row = t * tile;
        const int rows = static_cast<int>(std::min<int64_t>(tile, n - row));
        UNPACK[p](q + row * nb * BYTES, d + row * nb, m + row * nb, nb, rows, wq.data(), wd.data(), wm.data());
        for (int64_t i0 = 0; i0 < M; i0 += MAX_ROWS) {
          const int rows_x = static_cast<int>(std::min<int64_t>(MAX_ROWS, M - i0));
          for (int r = 0; r < rows_x; ++r)
            acts[r] = ActRow{xq.data() + (i0 + r) * k, dx.data() + (i0 + r) * nb, sx.data() + (i0 + r) * nb};
          GEMMS[p][rows_x - 1](wq.data(), wd.data(), wm.data(), acts, nb, rows, out + i0 * n + row, n);
        }
      }
    });
    return result();
  }
#endif
  const int64_t tiles = (n + WEIGHT_TILE - 1) / WEIGHT_TILE;
  const int64_t grain = std::max<int64_t>(1, MIN_TASK_WORK / (nb * M * WEIGHT_TILE));
  const int64_t ahead = (std::max<int64_t>(1, PREFETCH_BYTES / (nb * BYTES)) + WEIGHT_TILE - 1) / WEIGHT_TILE * WEIGHT_TILE;
  at::parallel_for(0, tiles, grain, [&](int64_t tile_begin, int64_t tile_end) {
    WeightRow w[WEIGHT_TILE];
    ActRow acts[MAX_ROWS];
    const int64_t end = std::min(n, tile_end * WEIGHT_TILE);
    for (int64_t row = tile_begin * WEIGHT_TILE; row < end;) {
      const int rows_w = end - row >= WEIGHT_TILE ? WEIGHT_TILE : 1;
      for (int i = 0; i < rows_w; ++i) w[i] = WeightRow{q + (row + i) * nb * BYTES, d + (row + i) * nb, m + (row + i) * nb};
      if (row + ahead + rows_w <= end) prefetch_rows(q, d, m, nb, row + ahead, rows_w);
      for (int64_t i0 = 0; i0 < M; i0 += MAX_ROWS) {
        const int rows_x = static_cast<int>(std::min<int64_t>(MAX_ROWS, M - i0));
        for (int r = 0; r < rows_x; ++r)
          acts[r] = ActRow{xq.data() + (i0 + r) * k, dx.data() + (i0 + r) * nb, sx.data() + (i0 + r) * nb};
        KERNELS[p][rows_w == WEIGHT_TILE][rows_x - 1](w, acts, nb, out + i0 * n + row, n);
      }
      row += rows_w;
    }
  });
  return result();
}

}  // namespace

// FRAGMENT, not TORCH_LIBRARY: the namespace can then take the course's other kernels' ops too.
// Calling an op registered here costs about a microsecond in the dispatcher (a Python
// torch.library.custom_op costs far more per call); its fake (shape) function is in w4a8.py.
TORCH_LIBRARY_FRAGMENT(labsupport, m) {
  m.def("w4a8_linear(Tensor x, Tensor packed, Tensor scales, Tensor mins, str path='auto') -> Tensor");
  m.def("w4a8_paths() -> str[]", &w4a8_paths);
  m.def("w4a8_gemm_min_rows() -> int", [] { return GEMM_MIN_ROWS; });
}

TORCH_LIBRARY_IMPL(labsupport, CPU, m) {
  m.impl("w4a8_linear", &w4a8_linear);
}

// Byte movers and argument readers shared by the shape kernels (see shape_common.h).
#include <algorithm>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

// One dim of a strided view: extent, source stride and destination stride, both in bytes.
struct ViewDim {
  int64_t n;
  int64_t src;
  int64_t dst;
};

// Calls fn(src_offset, dst_offset) for the flat indices [begin, end) of `dims` (row-major), keeping
// the offsets up to date incrementally; only the first index is decomposed by division.
template <typename Fn>
void for_index_range(const std::vector<ViewDim>& dims, int64_t begin, int64_t end, Fn&& fn) {
  const size_t k = dims.size();
  if (k == 0) {
    if (begin < end) fn(int64_t{0}, int64_t{0});
    return;
  }
  std::vector<int64_t> idx(k, 0);
  int64_t so = 0, dof = 0, rem = begin;
  for (size_t d = k; d-- > 0;) {
    idx[d] = rem % dims[d].n;
    rem /= dims[d].n;
    so += idx[d] * dims[d].src;
    dof += idx[d] * dims[d].dst;
  }
  for (int64_t it = begin; it < end; ++it) {
    fn(so, dof);
    for (size_t d = k; d-- > 0;) {
      so += dims[d].src;
      dof += dims[d].dst;
      if (++idx[d] < dims[d].n) break;
      so -= dims[d].src * dims[d].n;
      dof -= dims[d].dst * dims[d].n;
      idx[d] = 0;
    }
  }
}

int64_t count_of(const std::vector<ViewDim>& dims) {
  int64_t n = 1;
  for (const ViewDim& d : dims) n *= d.n;
  return n;
}

template <size_t N>
void copy_rows(std::byte* dst, const std::byte* src, const std::vector<ViewDim>& outer, const ViewDim& inner,
               size_t block) {
  const int64_t n = inner.n, s = inner.src, bs = static_cast<int64_t>(block);
  const int64_t rows = count_of(outer);
  parallel_chunks(rows, rows * n * bs, [&](int64_t b, int64_t e) {
    for_index_range(outer, b, e, [&](int64_t so, int64_t dof) {
      // Local copies: byte stores may alias any object whose address escaped (the captures).
      const int64_t cnt = n, sstep = s, dstep = bs;
      const size_t size = block;
      const std::byte* sp = src + so;
      std::byte* dp = dst + dof;
      for (int64_t i = 0; i < cnt; ++i) copy_elem<N>(dp + i * dstep, sp + i * sstep, size);
    });
  });
}

#if defined(__SSE2__)
// dst[c * dst_ld + r] = src[r * src_ld + c] for r, c < 16: interleaving rows pairwise at 8, 16, 32
// and 64 bits gathers each column's 16 bytes into one register.
inline void transpose_16x16_bytes(std::byte* dst, int64_t dst_ld, const std::byte* src, int64_t src_ld) {
  __m128i x[16], t[16];
  for (int i = 0; i < 16; ++i) x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * src_ld));
  for (int i = 0; i < 8; ++i) {  // t[2i]: columns 0-7 of rows 2i, 2i+1 as byte pairs; t[2i+1]: columns 8-15
    t[2 * i] = _mm_unpacklo_epi8(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm_unpackhi_epi8(x[2 * i], x[2 * i + 1]);
  }
  for (int j = 0; j < 4; ++j) {  // x[4j + q]: columns 4q..4q+3 of rows 4j..4j+3 as 4-byte groups
    x[4 * j + 0] = _mm_unpacklo_epi16(t[4 * j], t[4 * j + 2]);
    x[4 * j + 1] = _mm_unpackhi_epi16(t[4 * j], t[4 * j + 2]);
    x[4 * j + 2] = _mm_unpacklo_epi16(t[4 * j + 1], t[4 * j + 3]);
    x[4 * j + 3] = _mm_unpackhi_epi16(t[4 * j + 1], t[4 * j + 3]);
  }
  for (int k = 0; k < 2; ++k)  // t[8k + 2q (+1)]: columns 4q, 4q+1 (4q+2, 4q+3) of rows 8k..8k+7
    for (int q = 0; q < 4; ++q) {
      t[8 * k + 2 * q] = _mm_unpacklo_epi32(x[8 * k + q], x[8 * k + 4 + q]);
      t[8 * k + 2 * q + 1] = _mm_unpackhi_epi32(x[8 * k + q], x[8 * k + 4 + q]);
    }
  for (int c = 0; c < 16; ++c) {  // column c: its 8 bytes of rows 0-7, then of rows 8-15
    const int i = 2 * (c / 4) + (c % 4) / 2;
    const __m128i col = c % 2 == 0 ? _mm_unpacklo_epi64(t[i], t[8 + i]) : _mm_unpackhi_epi64(t[i], t[8 + i]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c * dst_ld), col);
  }
}
#endif

// A transposing 2-D block: source element (r, c) at src + r * src_ld + c * N goes to
// dst + c * dst_ld + r * N (r < rows, c < cols). Rows/cols are ranges of one tile.
template <size_t N>
void transpose_tile(std::byte* dst, int64_t dst_ld, const std::byte* src, int64_t src_ld, int64_t r0, int64_t r1,
                    int64_t c0, int64_t c1, size_t block) {
  const int64_t bs = static_cast<int64_t>(block);
  int64_t r = r0;
#if defined(__SSE2__)
  // 16x16 (byte-sized), 4x4 (float-sized) and 2x2 (double-sized) register transposes: 16-byte
  // loads and stores. Bytes: u8/s8 activations, e.g. the keys transposed for attention scores.
  if constexpr (N == 1) {
    for (; r + 16 <= r1; r += 16) {
      int64_t c = c0;
      for (; c + 16 <= c1; c += 16) transpose_16x16_bytes(dst + c * dst_ld + r, dst_ld, src + r * src_ld + c, src_ld);
      for (; c < c1; ++c)
        for (int64_t k = 0; k < 16; ++k) dst[c * dst_ld + r + k] = src[(r + k) * src_ld + c];
    }
  } else if constexpr (N == 4) {
    for (; r + 4 <= r1; r += 4) {
      int64_t c = c0;
      for (; c + 4 <= c1; c += 4) {
        const std::byte* s = src + r * src_ld + c * 4;
        __m128 x0 = _mm_loadu_ps(reinterpret_cast<const float*>(s));
        __m128 x1 = _mm_loadu_ps(reinterpret_cast<const float*>(s + src_ld));
        __m128 x2 = _mm_loadu_ps(reinterpret_cast<const float*>(s + 2 * src_ld));
        __m128 x3 = _mm_loadu_ps(reinterpret_cast<const float*>(s + 3 * src_ld));
        _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
        std::byte* d = dst + c * dst_ld + r * 4;
        _mm_storeu_ps(reinterpret_cast<float*>(d), x0);
        _mm_storeu_ps(reinterpret_cast<float*>(d + dst_ld), x1);
        _mm_storeu_ps(reinterpret_cast<float*>(d + 2 * dst_ld), x2);
        _mm_storeu_ps(reinterpret_cast<float*>(d + 3 * dst_ld), x3);
      }
      for (; c < c1; ++c)
        for (int64_t k = 0; k < 4; ++k) copy_elem<4>(dst + c * dst_ld + (r + k) * 4, src + (r + k) * src_ld + c * 4, 4);
    }
  } else if constexpr (N == 8) {
    for (; r + 2 <= r1; r += 2) {
      int64_t c = c0;
      for (; c + 2 <= c1; c += 2) {
        const std::byte* s = src + r * src_ld + c * 8;
        const __m128d x0 = _mm_loadu_pd(reinterpret_cast<const double*>(s));
        const __m128d x1 = _mm_loadu_pd(reinterpret_cast<const double*>(s + src_ld));
        std::byte* d = dst + c * dst_ld + r * 8;
        _mm_storeu_pd(reinterpret_cast<double*>(d), _mm_unpacklo_pd(x0, x1));
        _mm_storeu_pd(reinterpret_cast<double*>(d + dst_ld), _mm_unpackhi_pd(x0, x1));
      }
      for (; c < c1; ++c)
        for (int64_t k = 0; k < 2; ++k) copy_elem<8>(dst + c * dst_ld + (r + k) * 8, src + (r + k) * src_ld + c * 8, 8);
    }
  }
#endif
  // Remaining rows (all of them for other element sizes): contiguous reads, writes within the tile.
  for (; r < r1; ++r) {
    const std::byte* s = src + r * src_ld;
    std::byte* d = dst + r * bs;
    for (int64_t c = c0; c < c1; ++c) copy_elem<N>(d + c * dst_ld, s + c * bs, block);
  }
}

// Tile extents (source rows x source columns): 16 x 64 keeps a tile's source and destination
// lines in L1 and gives 64-byte destination runs for 4-byte elements.
constexpr int64_t kTileRows = 16, kTileCols = 64;

// The view's innermost (destination-contiguous) dim `b` is strided in src while dim `a` is
// contiguous in src: per outer index, a transpose of the (b x a) source matrix, tile by tile.
template <size_t N>
void copy_tiled(std::byte* dst, const std::byte* src, const std::vector<ViewDim>& outer, const ViewDim& a,
                const ViewDim& b, size_t block) {
  const int64_t row_tiles = (b.n + kTileRows - 1) / kTileRows, col_tiles = (a.n + kTileCols - 1) / kTileCols;
  const int64_t tiles = row_tiles * col_tiles;
  const int64_t units = count_of(outer) * tiles;
  parallel_chunks(units, units * kTileRows * kTileCols * static_cast<int64_t>(block), [&](int64_t u0, int64_t u1) {
    // Walk the outer indices covered by this chunk; each contributes a range of its tiles.
    const int64_t o0 = u0 / tiles, o1 = (u1 + tiles - 1) / tiles;
    int64_t o = o0;
    for_index_range(outer, o0, o1, [&](int64_t so, int64_t dof) {
      const int64_t t0 = std::max(u0 - o * tiles, int64_t{0}), t1 = std::min(u1 - o * tiles, tiles);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t r0 = (t / col_tiles) * kTileRows, c0 = (t % col_tiles) * kTileCols;
        transpose_tile<N>(dst + dof, a.dst, src + so, b.src, r0, std::min(r0 + kTileRows, b.n), c0,
                          std::min(c0 + kTileCols, a.n), block);
      }
      ++o;
    });
  });
}

}  // namespace

void fill_elems(void* dst, const void* value, size_t elem_size, int64_t count) {
  if (count <= 0) return;
  auto* d = static_cast<std::byte*>(dst);
  const auto* v = static_cast<const std::byte*>(value);
  // All-zero patterns (the common pad/constant value) are one memset.
  if (std::all_of(v, v + elem_size, [](std::byte b) { return b == std::byte{0}; })) {
    std::memset(d, 0, elem_size * static_cast<size_t>(count));
    return;
  }
  dispatch_elem_size(elem_size, [&](auto n) {
    constexpr size_t N = decltype(n)::value;
    for (int64_t i = 0; i < count; ++i) copy_elem<N>(d + i * static_cast<int64_t>(elem_size), v, elem_size);
  });
}

void copy_blocks(void* dst_v, int64_t dst_stride, const void* src_v, int64_t src_stride, int64_t count,
                 size_t block) {
  if (count <= 0 || block == 0) return;
  auto* dst = static_cast<std::byte*>(dst_v);
  const auto* src = static_cast<const std::byte*>(src_v);
  // Pieces of at most 64 KB so that a single big block still spreads over the team.
  const int64_t pieces = std::max<int64_t>(1, static_cast<int64_t>(block >> 16));
  const int64_t units = count * pieces;
  parallel_chunks(units, count * static_cast<int64_t>(block), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t i = u / pieces, k = u % pieces;
      const size_t b = block * static_cast<size_t>(k) / static_cast<size_t>(pieces);
      const size_t e = block * static_cast<size_t>(k + 1) / static_cast<size_t>(pieces);
      std::memcpy(dst + i * dst_stride + static_cast<int64_t>(b), src + i * src_stride + static_cast<int64_t>(b), e - b);
    }
  });
}

void strided_copy(void* dst_v, const void* src_v, const Shape& shape, const std::vector<int64_t>& src_strides,
                  size_t elem_size) {
  auto* dst = static_cast<std::byte*>(dst_v);
  const auto* src = static_cast<const std::byte*>(src_v);
  const int64_t es = static_cast<int64_t>(elem_size);

  // Drop size-1 dims, merge a dim into the next-inner one when the pair is contiguous in src
  // (dst is contiguous, so always mergeable there).
  std::vector<ViewDim> dims;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    ViewDim v{shape[d], src_strides[d] * es, 0};
    if (!dims.empty() && dims.back().src == v.src * v.n) dims.back() = {dims.back().n * v.n, v.src, 0};
    else dims.push_back(v);
  }
  // A contiguous innermost dim becomes part of the element: one memcpy per run.
  size_t block = elem_size;
  if (!dims.empty() && dims.back().src == es) {
    block *= static_cast<size_t>(dims.back().n);
    dims.pop_back();
  }
  if (dims.empty()) {
    std::memcpy(dst, src, block);
    return;
  }
  int64_t dstride = static_cast<int64_t>(block);
  for (size_t d = dims.size(); d-- > 0;) {
    dims[d].dst = dstride;
    dstride *= dims[d].n;
  }

  const ViewDim inner = dims.back();
  // Transposing views: some outer dim is the one contiguous in src; copy (that dim x innermost)
  // in tiles, reading runs of it instead of single strided elements (this also covers a short
  // strided innermost dim, as NCHW->NHWC with 3 channels).
  std::optional<size_t> contiguous;
  for (size_t d = 0; d + 1 < dims.size(); ++d)
    if (dims[d].src == static_cast<int64_t>(block) && dims[d].n >= 8) contiguous = d;
  if (contiguous) {
    const ViewDim a = dims[*contiguous];
    std::vector<ViewDim> outer;
    for (size_t d = 0; d + 1 < dims.size(); ++d)
      if (d != *contiguous) outer.push_back(dims[d]);
    dispatch_elem_size(block, [&](auto n) { copy_tiled<decltype(n)::value>(dst, src, outer, a, inner, block); });
    return;
  }
  dims.pop_back();
  dispatch_elem_size(block, [&](auto n) { copy_rows<decltype(n)::value>(dst, src, dims, inner, block); });
}

void transpose_bytes(void* dst, const void* src, const Shape& in_shape, const std::vector<int64_t>& perm,
                     size_t elem_size) {
  const std::vector<int64_t> in_strides = contiguous_strides(in_shape);
  Shape out_shape(perm.size());
  std::vector<int64_t> strides(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) {
    out_shape[d] = in_shape[static_cast<size_t>(perm[d])];
    strides[d] = in_strides[static_cast<size_t>(perm[d])];
  }
  strided_copy(dst, src, out_shape, strides, elem_size);
}

bool output_requested(const KernelContext& ctx, size_t i) {
  if (i >= ctx.num_outputs()) return false;
  const auto& names = ctx.node().outputs;
  return i >= names.size() || !names[i].empty();
}

std::vector<int64_t> read_ints(const Tensor& t, const ir::Node& node, const std::string& what) {
  switch (t.dtype()) {
    case DType::kInt64:
    case DType::kInt32:
    case DType::kInt16:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64: return t.to_int64_vector();
    default:
      fail(ErrorKind::kInvalidModel, node.describe() + ": " + what + " must be an integer tensor, got " +
                                         dtype_name(t.dtype()));
  }
}

int64_t checked_numel(const Shape& s, const ir::Node& node, const std::string& what) {
  for (int64_t d : s)
    SQ_CHECK(d >= 0, ErrorKind::kInvalidArgument,
             node.describe() + ": " + what + " " + shape_str(s) + " has a negative dimension");
  return shape_numel(s);
}

IntListArg IntListArg::from_attr(const ir::Node& node, const std::string& attr) {
  IntListArg a;
  if (node.has_attr(attr)) a.cached_ = node.attr_ints(attr);
  return a;
}

IntListArg IntListArg::from_input(const KernelInit& init, size_t input, std::string what) {
  IntListArg a;
  a.input_ = static_cast<int>(input);
  a.what_ = std::move(what);
  if (!init.node.input(input).empty() && init.constant_input)
    if (const Tensor* t = init.constant_input(input)) a.cached_ = read_ints(*t, init.node, a.what_);
  return a;
}

std::vector<int64_t> IntListArg::get(const KernelContext& ctx) const {
  if (cached_) return *cached_;
  if (input_ >= 0 && ctx.has_input(static_cast<size_t>(input_)))
    return read_ints(ctx.input(static_cast<size_t>(input_)), ctx.node(), what_);
  return {};
}

}  // namespace slimquant::runtime::shape

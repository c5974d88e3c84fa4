// Shape / data-movement kernels: the behaviour ONNX's node test data covers thinly — views that must
// not copy, every Transpose path against a plain reference, negative-step slices of 1-byte data,
// opset-dependent attribute/input forms, and error messages that name the node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "kernel_test_util.h"
#include "runtime/kernels/shape/shape_common.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {
namespace {

using kernel_test::make_node;
using kernel_test::run_op;

template <typename T>
Tensor iota_tensor(const Shape& s) {
  Tensor t(dtype_of<T>, s);
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(i);
  return t;
}

Tensor ints(const std::vector<int64_t>& v) { return Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v); }

// Element-by-element transpose with index arithmetic: the obviously-correct reference.
void reference_transpose(const std::byte* src, std::byte* dst, const Shape& in, const std::vector<int64_t>& perm,
                         size_t es) {
  const size_t r = in.size();
  Shape out(r);
  for (size_t d = 0; d < r; ++d) out[d] = in[static_cast<size_t>(perm[d])];
  const std::vector<int64_t> is = contiguous_strides(in);
  const int64_t n = shape_numel(in);
  for (int64_t o = 0; o < n; ++o) {
    int64_t rem = o, src_off = 0;
    for (size_t d = r; d-- > 0;) {
      const int64_t i = rem % out[d];
      rem /= out[d];
      src_off += i * is[static_cast<size_t>(perm[d])];
    }
    std::memcpy(dst + o * static_cast<int64_t>(es), src + src_off * static_cast<int64_t>(es), es);
  }
}

// ---- views -------------------------------------------------------------------------------------

TEST(ShapeKernels, ReshapeAliasesInputStorage) {
  ir::Node n = make_node("Reshape", 2, 1);
  const Tensor x = iota_tensor<float>({2, 3, 4});
  auto out = run_op(n, 14, {x, ints({0, -1})});
  EXPECT_EQ(out[0].shape(), (Shape{2, 12}));
  EXPECT_EQ(out[0].storage().get(), x.storage().get()) << "Reshape must be a view, not a copy";
  // Constant shape input, read once at kernel creation: still a view.
  out = run_op(n, 14, {x, ints({4, 6})}, {false, true});
  EXPECT_EQ(out[0].shape(), (Shape{4, 6}));
  EXPECT_EQ(out[0].raw(), x.raw());
}

TEST(ShapeKernels, ViewOpsDoNotCopy) {
  const Tensor x = iota_tensor<int8_t>({1, 3, 1, 5});
  EXPECT_EQ(run_op(make_node("Flatten", 1, 1), 13, {x})[0].raw(), x.raw());
  EXPECT_EQ(run_op(make_node("Squeeze", 2, 1), 13, {x, ints({0, 2})})[0].raw(), x.raw());
  EXPECT_EQ(run_op(make_node("Unsqueeze", 2, 1), 13, {x, ints({-1})})[0].raw(), x.raw());
  EXPECT_EQ(run_op(make_node("Identity", 1, 1), 16, {x})[0].raw(), x.raw());
  EXPECT_EQ(run_op(make_node("Dropout", 1, 1), 13, {x})[0].raw(), x.raw());
  // Data-movement ops whose result is the whole input unchanged return it as a view too.
  ir::Node cat = make_node("Concat", 1, 1);
  cat.attrs["axis"] = int64_t{1};
  EXPECT_EQ(run_op(cat, 13, {x})[0].raw(), x.raw());
  EXPECT_EQ(run_op(make_node("Slice", 3, 1), 13, {x, ints({0}), ints({INT64_MAX})})[0].raw(), x.raw());
  EXPECT_EQ(run_op(make_node("Expand", 2, 1), 13, {x, ints({1, 1})})[0].raw(), x.raw());
  EXPECT_EQ(run_op(make_node("Tile", 2, 1), 13, {x, ints({1, 1, 1, 1})})[0].raw(), x.raw());
  EXPECT_EQ(run_op(make_node("Pad", 2, 1), 13, {x, ints({0, 0, 0, 0, 0, 0, 0, 0})})[0].raw(), x.raw());
}

TEST(ShapeKernels, ReshapeRules) {
  ir::Node n = make_node("Reshape", 2, 1);
  const Tensor x = iota_tensor<float>({2, 3, 4});
  EXPECT_EQ(run_op(n, 14, {x, ints({0, 0, -1})})[0].shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(run_op(n, 14, {x, ints({-1})})[0].shape(), (Shape{24}));
  // allowzero=1: a 0 is a real zero-size dim.
  n.attrs["allowzero"] = int64_t{1};
  const Tensor empty(DType::kFloat32, {0, 3, 4});
  EXPECT_EQ(run_op(n, 14, {empty, ints({3, 4, 0})})[0].shape(), (Shape{3, 4, 0}));
  // Reshape-1: shape as an attribute.
  ir::Node old = make_node("Reshape", 1, 1);
  old.attrs["shape"] = std::vector<int64_t>{6, 4};
  EXPECT_EQ(run_op(old, 1, {x})[0].shape(), (Shape{6, 4}));
}

TEST(ShapeKernels, ErrorsNameTheNode) {
  ir::Node n = make_node("Reshape", 2, 1);
  n.name = "/Reshape_1";
  const Tensor x = iota_tensor<float>({2, 3});
  try {
    run_op(n, 14, {x, ints({4, -1})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Reshape '/Reshape_1': cannot reshape [2x3] into [4x-1]"), std::string::npos)
        << e.what();
  }
  ir::Node g = make_node("Gather", 2, 1);
  try {
    run_op(g, 13, {iota_tensor<float>({3}), ints({3})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Gather '/Gather_0'"), std::string::npos) << e.what();
  }
}

// ---- Transpose ---------------------------------------------------------------------------------

// Every path of transpose_bytes (merged dims, memcpy runs, tiled 2-D blocks, strided rows, odd
// element sizes) against the reference, over random permutations of 4-D and 5-D shapes.
TEST(ShapeKernels, TransposeMatchesReferenceOnRandomPermutations) {
  std::mt19937 rng(1234);
  const std::vector<Shape> shapes = {{2, 3, 4, 5},   {1, 16, 9, 33},    {3, 40, 1, 37},  {2, 8, 8, 8},
                                     {2, 3, 1, 4, 5}, {1, 2, 33, 3, 17}, {4, 1, 1, 9, 2}, {2, 50, 4, 16},
                                     {3, 35, 48}};
  for (const Shape& shape : shapes) {
    const int64_t n = shape_numel(shape);
    for (size_t es : {size_t{1}, size_t{2}, size_t{4}, size_t{8}, size_t{12}}) {
      std::vector<std::byte> src(static_cast<size_t>(n) * es);
      for (auto& b : src) b = static_cast<std::byte>(rng());
      for (int trial = 0; trial < 6; ++trial) {
        std::vector<int64_t> perm(shape.size());
        std::iota(perm.begin(), perm.end(), int64_t{0});
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<std::byte> got(src.size(), std::byte{0xAB}), want(src.size());
        shape::transpose_bytes(got.data(), src.data(), shape, perm, es);
        reference_transpose(src.data(), want.data(), shape, perm, es);
        ASSERT_TRUE(got == want) << "shape " << shape_str(shape) << " perm " << shape_str(perm) << " elem " << es;
      }
    }
  }
}

TEST(ShapeKernels, TransposeFastPathsNchwNhwcAndMatrix) {
  struct Case {
    Shape shape;
    std::vector<int64_t> perm;
  };
  // NCHW->NHWC, NHWC->NCHW, plain and batched matrix transposes, large enough to take the tiles.
  const std::vector<Case> cases = {{{2, 64, 17, 19}, {0, 2, 3, 1}},
                                   {{2, 17, 19, 64}, {0, 3, 1, 2}},
                                   {{131, 67}, {1, 0}},
                                   {{3, 50, 70}, {0, 2, 1}},
                                   {{8, 12, 16, 20}, {3, 2, 1, 0}}};
  for (const Case& c : cases) {
    const Tensor x = iota_tensor<float>(c.shape);
    ir::Node n = make_node("Transpose", 1, 1);
    n.attrs["perm"] = c.perm;
    const Tensor y = run_op(n, 13, {x})[0];
    Tensor want(DType::kFloat32, y.shape());
    reference_transpose(static_cast<const std::byte*>(x.raw()), static_cast<std::byte*>(want.raw()), c.shape, c.perm, 4);
    ASSERT_EQ(std::memcmp(y.raw(), want.raw(), y.nbytes()), 0) << shape_str(c.shape) << " perm " << shape_str(c.perm);
  }
  // Default perm reverses the axes.
  const Tensor x = iota_tensor<int16_t>({2, 3, 4});
  const Tensor y = run_op(make_node("Transpose", 1, 1), 13, {x})[0];
  EXPECT_EQ(y.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(y.data<int16_t>()[1], 12);  // y[0][0][1] = x[1][0][0]
}

// Copies of several MB take the multi-threaded paths (tiles, rows and blocks split over a team).
TEST(ShapeKernels, LargeCopiesSplitAcrossThreadsMatchReference) {
  const Shape shape{2, 48, 96, 97};
  const Tensor x = iota_tensor<float>(shape);
  for (const std::vector<int64_t>& perm : {std::vector<int64_t>{0, 2, 3, 1}, std::vector<int64_t>{0, 1, 3, 2},
                                           std::vector<int64_t>{2, 0, 1, 3}}) {
    ir::Node n = make_node("Transpose", 1, 1);
    n.attrs["perm"] = perm;
    const Tensor y = run_op(n, 13, {x})[0];
    Tensor want(DType::kFloat32, y.shape());
    reference_transpose(static_cast<const std::byte*>(x.raw()), static_cast<std::byte*>(want.raw()), shape, perm, 4);
    ASSERT_EQ(std::memcmp(y.raw(), want.raw(), y.nbytes()), 0) << "perm " << shape_str(perm);
  }
  // Split into 3 along C (few big blocks per row), concatenate back.
  ir::Node sp = make_node("Split", 2, 3);
  sp.attrs["axis"] = int64_t{1};
  const auto parts = run_op(sp, 13, {x, ints({16, 31, 1})});
  ir::Node cat = make_node("Concat", 3, 1);
  cat.attrs["axis"] = int64_t{1};
  const Tensor back = run_op(cat, 13, {parts[0], parts[1], parts[2]})[0];
  ASSERT_EQ(std::memcmp(back.raw(), x.raw(), x.nbytes()), 0);
  // Split along the outermost axis: one block per output, split into pieces across threads.
  ir::Node sp0 = make_node("Split", 1, 2);
  const auto halves = run_op(sp0, 13, {x});
  ASSERT_EQ(std::memcmp(halves[1].raw(), x.data<float>() + x.numel() / 2, halves[1].nbytes()), 0);
  // Strided slice rows.
  const Tensor y = run_op(make_node("Slice", 5, 1), 13,
                          {x, ints({1, -1}), ints({INT64_MAX, INT64_MIN}), ints({2, 3}), ints({3, -2})})[0];
  ASSERT_EQ(y.shape(), (Shape{2, 48, 32, 49}));
  const float* yp = y.data<float>();
  bool ok = true;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 48; ++c)
      for (int64_t h = 0; h < 32; ++h)
        for (int64_t w = 0; w < 49; ++w)
          ok = ok && *yp++ == static_cast<float>(((n * 48 + c) * 96 + 1 + 3 * h) * 97 + 96 - 2 * w);
  EXPECT_TRUE(ok);
}

// ---- Slice -------------------------------------------------------------------------------------

TEST(ShapeKernels, SliceNegativeStepsOnInt8) {
  const Tensor x = iota_tensor<int8_t>({4, 5, 6});
  ir::Node n = make_node("Slice", 5, 1);
  // x[3:0:-2, ::-1, -2:0:-3] (INT64_MIN end: run to the front).
  const Tensor y = run_op(n, 13, {x, ints({3, -1, -2}), ints({0, INT64_MIN, 0}), ints({0, 1, 2}), ints({-2, -1, -3})})[0];
  ASSERT_EQ(y.shape(), (Shape{2, 5, 2}));
  std::vector<int8_t> want;
  for (int i : {3, 1})
    for (int j = 4; j >= 0; --j)
      for (int k : {4, 1}) want.push_back(static_cast<int8_t>(i * 30 + j * 6 + k));
  EXPECT_EQ(std::vector<int8_t>(y.values<int8_t>().begin(), y.values<int8_t>().end()), want);
}

TEST(ShapeKernels, SliceClampsAndHandlesEmptyAndOldOpset) {
  const Tensor x = iota_tensor<int8_t>({10});
  ir::Node n = make_node("Slice", 3, 1);
  // Out-of-range starts/ends clamp; INT64_MAX end.
  Tensor y = run_op(n, 13, {x, ints({-100}), ints({INT64_MAX})})[0];
  EXPECT_EQ(y.numel(), 10);
  y = run_op(n, 13, {x, ints({20}), ints({30})})[0];
  EXPECT_EQ(y.shape(), (Shape{0}));
  // Reversal of a whole axis with start beyond the end.
  ir::Node s = make_node("Slice", 5, 1);
  y = run_op(s, 13, {x, ints({100}), ints({-100}), ints({0}), ints({-1})})[0];
  ASSERT_EQ(y.numel(), 10);
  EXPECT_EQ(y.data<int8_t>()[0], 9);
  EXPECT_EQ(y.data<int8_t>()[9], 0);
  // Slice-1: attributes.
  ir::Node old = make_node("Slice", 1, 1);
  old.attrs["starts"] = std::vector<int64_t>{2};
  old.attrs["ends"] = std::vector<int64_t>{5};
  y = run_op(old, 1, {x})[0];
  ASSERT_EQ(y.numel(), 3);
  EXPECT_EQ(y.data<int8_t>()[0], 2);
}

// ---- opset-dependent forms and other ops ---------------------------------------------------------

TEST(ShapeKernels, SqueezeUnsqueezeAttributeFormsBeforeOpset13) {
  const Tensor x = iota_tensor<float>({1, 3, 1, 5});
  ir::Node sq = make_node("Squeeze", 1, 1);
  sq.attrs["axes"] = std::vector<int64_t>{-2};
  EXPECT_EQ(run_op(sq, 11, {x})[0].shape(), (Shape{1, 3, 5}));
  EXPECT_EQ(run_op(make_node("Squeeze", 1, 1), 13, {x})[0].shape(), (Shape{3, 5}));  // no axes: all 1s
  EXPECT_EQ(run_op(make_node("Squeeze", 2, 1), 13, {x, ints({})})[0].shape(), (Shape{3, 5}));  // empty axes too
  ir::Node un = make_node("Unsqueeze", 1, 1);
  un.attrs["axes"] = std::vector<int64_t>{0, 5};
  EXPECT_EQ(run_op(un, 11, {x})[0].shape(), (Shape{1, 1, 3, 1, 5, 1}));
}

TEST(ShapeKernels, ConcatSplitRoundTripAllElementSizes) {
  for (DType dt : {DType::kInt8, DType::kInt16, DType::kFloat32, DType::kFloat64, DType::kBool}) {
    Tensor x(dt, {3, 7, 5});
    auto* b = static_cast<uint8_t*>(x.raw());
    for (size_t i = 0; i < x.nbytes(); ++i) b[i] = dt == DType::kBool ? (i % 3 == 0) : static_cast<uint8_t>(i * 7);
    ir::Node sp = make_node("Split", 2, 3);
    sp.attrs["axis"] = int64_t{1};
    auto parts = run_op(sp, 13, {x, ints({2, 0, 5})});
    EXPECT_EQ(parts[1].shape(), (Shape{3, 0, 5}));
    ir::Node cat = make_node("Concat", 3, 1);
    cat.attrs["axis"] = int64_t{-2};
    const Tensor y = run_op(cat, 13, {parts[0], parts[1], parts[2]})[0];
    ASSERT_EQ(y.shape(), x.shape());
    EXPECT_EQ(std::memcmp(y.raw(), x.raw(), x.nbytes()), 0) << dtype_name(dt);
  }
}

TEST(ShapeKernels, GatherInt32NegativeIndicesAndScalar) {
  const Tensor x = iota_tensor<uint8_t>({4, 3});
  ir::Node g = make_node("Gather", 2, 1);
  g.attrs["axis"] = int64_t{1};
  const Tensor idx = Tensor::from_vector<int32_t>({2}, {-1, 0});
  Tensor y = run_op(g, 13, {x, idx})[0];
  ASSERT_EQ(y.shape(), (Shape{4, 2}));
  EXPECT_EQ(y.data<uint8_t>()[0], 2);
  EXPECT_EQ(y.data<uint8_t>()[1], 0);
  EXPECT_EQ(y.data<uint8_t>()[7], 9);
  y = run_op(make_node("Gather", 2, 1), 13, {x, Tensor::scalar<int64_t>(-1)})[0];
  ASSERT_EQ(y.shape(), (Shape{3}));
  EXPECT_EQ(y.data<uint8_t>()[0], 9);
}

TEST(ShapeKernels, PadModesIncludingWideReflectAndCrop) {
  const Tensor x = Tensor::from_vector<int8_t>({1, 3}, {1, 2, 3});
  ir::Node p = make_node("Pad", 3, 1);
  p.attrs["mode"] = std::string("reflect");
  // Pads wider than the axis keep bouncing: ... 2 3 2 [1 2 3] 2 1 2 3 2
  Tensor y = run_op(p, 13, {x, ints({0, 3, 0, 5})})[0];
  EXPECT_EQ(std::vector<int8_t>(y.values<int8_t>().begin(), y.values<int8_t>().end()),
            (std::vector<int8_t>{2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2}));
  p.attrs["mode"] = std::string("constant");
  y = run_op(p, 13, {x, ints({1, -1, 0, 1}), Tensor::scalar<int8_t>(-7)})[0];
  EXPECT_EQ(std::vector<int8_t>(y.values<int8_t>().begin(), y.values<int8_t>().end()),
            (std::vector<int8_t>{-7, -7, -7, 2, 3, -7}));
  // Pad-2: pads and value as attributes.
  ir::Node old = make_node("Pad", 1, 1);
  old.attrs["mode"] = std::string("edge");
  old.attrs["pads"] = std::vector<int64_t>{0, 1, 0, 0};
  y = run_op(old, 2, {x})[0];
  EXPECT_EQ(std::vector<int8_t>(y.values<int8_t>().begin(), y.values<int8_t>().end()),
            (std::vector<int8_t>{1, 1, 2, 3}));
}

TEST(ShapeKernels, ExpandAndTileReplicate) {
  const Tensor x = Tensor::from_vector<int16_t>({3, 1}, {1, 2, 3});
  Tensor y = run_op(make_node("Expand", 2, 1), 13, {x, ints({2, 1, 4})})[0];
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(y.data<int16_t>()[0], 1);
  EXPECT_EQ(y.data<int16_t>()[7], 2);
  EXPECT_EQ(y.data<int16_t>()[23], 3);
  y = run_op(make_node("Tile", 2, 1), 13, {x, ints({2, 3})})[0];
  ASSERT_EQ(y.shape(), (Shape{6, 3}));
  EXPECT_EQ(std::vector<int16_t>(y.values<int16_t>().begin(), y.values<int16_t>().begin() + 6),
            (std::vector<int16_t>{1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(y.data<int16_t>()[17], 3);
}

TEST(ShapeKernels, ResizeNearestOnInt8AndLinearOnUInt8) {
  const Tensor x = Tensor::from_vector<int8_t>({1, 1, 2, 2}, {-1, 2, 3, -4});
  ir::Node r = make_node("Resize", 3, 1);
  r.inputs[1] = "";  // no roi
  Tensor scales = Tensor::from_vector<float>({4}, {1, 1, 2, 2});
  Tensor y = run_op(r, 13, {x, Tensor(), scales})[0];
  ASSERT_EQ(y.shape(), (Shape{1, 1, 4, 4}));
  EXPECT_EQ(std::vector<int8_t>(y.values<int8_t>().begin(), y.values<int8_t>().end()),
            (std::vector<int8_t>{-1, -1, 2, 2, -1, -1, 2, 2, 3, 3, -4, -4, 3, 3, -4, -4}));
  // Linear on uint8 rounds to nearest: align_corners 2 -> 3 gives the midpoint.
  r.attrs["mode"] = std::string("linear");
  r.attrs["coordinate_transformation_mode"] = std::string("align_corners");
  const Tensor u = Tensor::from_vector<uint8_t>({1, 2}, {10, 15});
  ir::Node r2 = make_node("Resize", 4, 1);
  r2.attrs = r.attrs;
  y = run_op(r2, 13, {u, Tensor(), Tensor(), ints({1, 3})})[0];
  EXPECT_EQ(std::vector<uint8_t>(y.values<uint8_t>().begin(), y.values<uint8_t>().end()),
            (std::vector<uint8_t>{10, 12, 15}));  // 12.5 rounds to even
}

TEST(ShapeKernels, DropoutTrainingModeNeedsZeroRatio) {
  const Tensor x = iota_tensor<float>({4});
  ir::Node d = make_node("Dropout", 3, 2);
  auto out = run_op(d, 13, {x, Tensor::scalar<float>(0.f), Tensor::scalar<bool>(true)});
  EXPECT_EQ(out[0].raw(), x.raw());
  ASSERT_EQ(out[1].dtype(), DType::kBool);
  for (bool m : out[1].values<bool>()) EXPECT_TRUE(m);
  try {
    run_op(d, 13, {x, Tensor::scalar<float>(0.5f), Tensor::scalar<bool>(true)});
    FAIL() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
}

TEST(ShapeKernels, RangeIntegerCountsAndShapeSlice) {
  Tensor y = run_op(make_node("Range", 3, 1), 11,
                    {Tensor::scalar<int64_t>(10), Tensor::scalar<int64_t>(-3), Tensor::scalar<int64_t>(-4)})[0];
  EXPECT_EQ(std::vector<int64_t>(y.values<int64_t>().begin(), y.values<int64_t>().end()),
            (std::vector<int64_t>{10, 6, 2, -2}));
  ir::Node s = make_node("Shape", 1, 1);
  s.attrs["start"] = int64_t{-2};
  y = run_op(s, 15, {Tensor(DType::kInt8, {2, 3, 4})})[0];
  EXPECT_EQ(std::vector<int64_t>(y.values<int64_t>().begin(), y.values<int64_t>().end()),
            (std::vector<int64_t>{3, 4}));
}

}  // namespace
}  // namespace slimquant::runtime

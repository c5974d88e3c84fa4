// Index and selection kernels (TopK, NonZero, Compress, GatherND, ScatterND, ScatterElements): the
// behaviour the ONNX node test data leaves out — TopK tie order on strided rows checked against a
// stable-sort reference, empty results, negative indices, and out-of-range indices reported as
// kInvalidArgument naming the node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "kernel_test_util.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {
namespace {

using kernel_test::make_node;
using kernel_test::run_op;

Tensor ints(const Shape& s, const std::vector<int64_t>& v) { return Tensor::from_vector<int64_t>(s, v); }
Tensor ints(const std::vector<int64_t>& v) { return ints({static_cast<int64_t>(v.size())}, v); }
Tensor floats(const Shape& s, const std::vector<float>& v) { return Tensor::from_vector<float>(s, v); }

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// Expects `fn` to throw kInvalidArgument with a message naming `who` and containing `detail`.
template <typename Fn>
void expect_invalid_argument(Fn&& fn, const std::string& who, const std::string& detail) {
  try {
    fn();
    FAIL() << "expected an error naming " << who;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(who), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(detail), std::string::npos) << e.what();
  }
}

// ---- TopK --------------------------------------------------------------------------------------

TEST(IndexOps, TopKTiesTakeTheLowerIndexFirst) {
  ir::Node n = make_node("TopK", 2, 2);
  const Tensor x = floats({1, 6}, {1, 3, 3, 2, 3, 0});
  auto out = run_op(n, 11, {x, ints({3})});
  EXPECT_EQ(out[0].shape(), (Shape{1, 3}));
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{3, 3, 3}));
  EXPECT_EQ(values_of<int64_t>(out[1]), (std::vector<int64_t>{1, 2, 4}));

  n.attrs["largest"] = int64_t{0};
  out = run_op(n, 11, {floats({1, 6}, {2, 1, 1, 0, 1, 0}), ints({4})});
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{0, 0, 1, 1}));
  EXPECT_EQ(values_of<int64_t>(out[1]), (std::vector<int64_t>{3, 5, 1, 2}));
}

// Many ties, a strided axis (axis 1 of [3, 100, 5]) and k from 0 to n, covering both selection
// paths (heap for small k, nth_element otherwise): against a stable sort.
TEST(IndexOps, TopKMatchesStableSortOnStridedRows) {
  const int64_t outer = 3, n = 100, inner = 5;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> small(0, 4);
  std::vector<int32_t> data(static_cast<size_t>(outer * n * inner));
  for (auto& v : data) v = small(rng);
  const Tensor x = Tensor::from_vector<int32_t>({outer, n, inner}, data);
  for (const bool largest : {true, false}) {
    for (const int64_t k : {0, 1, 5, 6, 7, 50, 99, 100}) {
      ir::Node node = make_node("TopK", 2, 2);
      node.attrs["axis"] = int64_t{1};
      node.attrs["largest"] = int64_t{largest ? 1 : 0};
      const auto out = run_op(node, 11, {x, ints({k})});
      ASSERT_EQ(out[1].shape(), (Shape{outer, k, inner}));
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          auto at = [&](int64_t j) { return data[static_cast<size_t>((o * n + j) * inner + i)]; };
          std::vector<int64_t> order(static_cast<size_t>(n));
          std::iota(order.begin(), order.end(), int64_t{0});
          std::stable_sort(order.begin(), order.end(),
                           [&](int64_t a, int64_t b) { return largest ? at(a) > at(b) : at(a) < at(b); });
          for (int64_t j = 0; j < k; ++j) {
            const int64_t pos = (o * k + j) * inner + i;
            ASSERT_EQ(out[1].data<int64_t>()[pos], order[static_cast<size_t>(j)])
                << "largest=" << largest << " k=" << k << " row (" << o << ", " << i << ") rank " << j;
            ASSERT_EQ(out[0].data<int32_t>()[pos], at(order[static_cast<size_t>(j)]));
          }
        }
      }
    }
  }
}

TEST(IndexOps, TopKOpset1ReadsTheKAttribute) {
  ir::Node n = make_node("TopK", 1, 2);
  n.attrs["k"] = int64_t{2};
  const auto out = run_op(n, 9, {floats({2, 3}, {5, 9, 7, 1, 0, 4})});
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{9, 7, 4, 1}));
  EXPECT_EQ(values_of<int64_t>(out[1]), (std::vector<int64_t>{1, 2, 2, 0}));
}

TEST(IndexOps, TopKWithKLargerThanTheAxisNamesTheNode) {
  ir::Node n = make_node("TopK", 2, 2);
  n.name = "/head/TopK_3";
  expect_invalid_argument([&] { run_op(n, 11, {floats({2, 3}, {0, 1, 2, 3, 4, 5}), ints({4})}); },
                          "TopK '/head/TopK_3'", "k = 4 is outside [0, 3]");
}

// ---- NonZero, Compress -------------------------------------------------------------------------

TEST(IndexOps, NonZeroOfAllZerosIsRankByZero) {
  const auto out = run_op(make_node("NonZero", 1, 1), 13, {Tensor(DType::kFloat32, {2, 3, 4})});
  EXPECT_EQ(out[0].dtype(), DType::kInt64);
  EXPECT_EQ(out[0].shape(), (Shape{3, 0}));
}

TEST(IndexOps, NonZeroListsCoordinatesInRowMajorOrder) {
  const auto out = run_op(make_node("NonZero", 1, 1), 13, {ints({2, 3}, {0, 7, 0, -1, 0, 2})});
  EXPECT_EQ(out[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(values_of<int64_t>(out[0]), (std::vector<int64_t>{0, 1, 1, 1, 0, 2}));
}

TEST(IndexOps, CompressRejectsASelectionPastTheAxis) {
  const Tensor cond = Tensor::from_vector<bool>({4}, {true, false, false, true});
  expect_invalid_argument(
      [&] {
        ir::Node n = make_node("Compress", 2, 1);
        n.attrs["axis"] = int64_t{0};
        run_op(n, 11, {floats({3, 1}, {1, 2, 3}), cond});
      },
      "Compress '/Compress_0'", "condition selects index 3 of an axis of size 3");
}

// ---- GatherND, ScatterND, ScatterElements ------------------------------------------------------

TEST(IndexOps, GatherNDWithBatchDimsAndNegativeIndices) {
  ir::Node n = make_node("GatherND", 2, 1);
  n.attrs["batch_dims"] = int64_t{1};
  // data [2, 3, 2], indices [2, 1]: batch b picks row indices[b] of data[b].
  const Tensor data = floats({2, 3, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const auto out = run_op(n, 13, {data, ints({2, 1}, {-1, 1})});
  EXPECT_EQ(out[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{4, 5, 8, 9}));
}

TEST(IndexOps, ScatterNDWithAnOutOfRangeIndexNamesTheNode) {
  ir::Node n = make_node("ScatterND", 3, 1);
  const Tensor data = floats({4, 2}, {0, 0, 0, 0, 0, 0, 0, 0});
  const Tensor updates = floats({2, 2}, {1, 2, 3, 4});
  expect_invalid_argument([&] { run_op(n, 16, {data, ints({2, 1}, {1, 4}), updates}); }, "ScatterND '/ScatterND_0'",
                          "index 4 out of range for an axis of size 4");
  expect_invalid_argument([&] { run_op(n, 16, {data, ints({2, 1}, {-5, 0}), updates}); }, "ScatterND '/ScatterND_0'",
                          "index -5 out of range");
  // In range, negative counts from the end.
  const auto out = run_op(n, 16, {data, ints({2, 1}, {-1, 0}), updates});
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{3, 4, 0, 0, 0, 0, 1, 2}));
}

TEST(IndexOps, ScatterElementsReductionsFoldDuplicates) {
  ir::Node n = make_node("ScatterElements", 3, 1);
  n.attrs["axis"] = int64_t{-1};
  n.attrs["reduction"] = std::string("mul");
  const auto out = run_op(n, 16, {floats({1, 3}, {2, 2, 2}), ints({1, 3}, {0, -3, 2}), floats({1, 3}, {3, 5, 7})});
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{30, 2, 14}));
  ir::Node bad = make_node("ScatterElements", 3, 1);
  expect_invalid_argument(
      [&] { run_op(bad, 16, {floats({2, 2}, {0, 0, 0, 0}), ints({1, 2}, {0, 2}), floats({1, 2}, {1, 1})}); },
      "ScatterElements '/ScatterElements_0'", "index 2 out of range");
}

}  // namespace
}  // namespace slimquant::runtime

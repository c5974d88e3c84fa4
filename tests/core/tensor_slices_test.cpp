// slice_along / concat_along / copy_along: the copies batching does along an axis other than the
// first.
#include <gtest/gtest.h>

#include "slimquant/core/tensor_slices.h"

using namespace slimquant;

namespace {

TEST(TensorSlices, SliceAndConcatAlongTheMiddleAxis) {
  Tensor t(DType::kInt64, {2, 3, 2});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = i;
  const Tensor middle = slice_along(t, 1, 1, 2);
  EXPECT_EQ(middle.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(middle.to_int64_vector(), (std::vector<int64_t>{2, 3, 4, 5, 8, 9, 10, 11}));
  const Tensor head = slice_along(t, 1, 0, 1);
  EXPECT_EQ(head.to_int64_vector(), (std::vector<int64_t>{0, 1, 6, 7}));
  const Tensor whole = concat_along({head, middle}, 1);
  EXPECT_EQ(whole.shape(), t.shape());
  EXPECT_EQ(whole.to_int64_vector(), t.to_int64_vector());
  // Along the last and the first axis too.
  EXPECT_EQ(slice_along(t, 2, 1, 1).to_int64_vector(), (std::vector<int64_t>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(concat_along({slice_along(t, 0, 1, 1), slice_along(t, 0, 0, 1)}, 0).to_int64_vector(),
            (std::vector<int64_t>{6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5}));

  EXPECT_THROW(slice_along(t, 1, 2, 2), Error);
  EXPECT_THROW(slice_along(t, 3, 0, 1), Error);
  EXPECT_THROW(concat_along({head, middle}, 0), Error) << "they differ on axis 1";
  EXPECT_THROW(concat_along({head, head.cast(DType::kFloat32)}, 1), Error);
  EXPECT_THROW(concat_along({}, 0), Error);
}

// copy_along puts parts into a whole at their offsets, the inverse of slice_along, on any axis.
TEST(TensorSlices, CopyAlongFillsTheWholeAtEachPartsOffset) {
  Tensor t(DType::kInt64, {2, 3, 2});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = i;
  for (size_t axis = 0; axis < 3; ++axis) {
    Tensor whole(DType::kInt64, t.shape());
    for (int64_t first = 0; first < t.dim(axis); ++first) copy_along(slice_along(t, axis, first, 1), whole, axis, first);
    EXPECT_EQ(whole.to_int64_vector(), t.to_int64_vector()) << "axis " << axis;
  }
  Tensor whole(DType::kInt64, t.shape());
  copy_along(slice_along(t, 1, 1, 2), whole, 1, 1);
  EXPECT_EQ(slice_along(whole, 1, 1, 2).to_int64_vector(), (std::vector<int64_t>{2, 3, 4, 5, 8, 9, 10, 11}));
  EXPECT_THROW(copy_along(slice_along(t, 1, 0, 2), whole, 1, 2), Error) << "past the end";
  EXPECT_THROW(copy_along(slice_along(t, 1, 0, 2), whole, 0, 0), Error) << "differs on axis 1";
  EXPECT_THROW(copy_along(slice_along(t, 0, 0, 1).cast(DType::kFloat32), whole, 0, 0), Error);
}

}  // namespace

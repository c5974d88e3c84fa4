// Observer::merge_state: the observers of a sharded calibration, merged in batch order, equal the
// one observer that saw every batch, bit for bit (docs/scale-out.md).
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "slimquant/core/distributed.h"
#include "slimquant/quant/observer.h"

namespace slimquant::quant {
namespace {

std::vector<Tensor> batches_with_growing_range() {
  // Ranges grow and shrink from batch to batch (the histogram range doubles several times inside
  // the second half), batches hold exact zeros, and are rank 2 so avg sees several samples each.
  std::mt19937 rng(7);
  std::vector<Tensor> out;
  const float spreads[] = {0.01f, 0.5f, 0.02f, 3.0f, 40.0f, 0.1f, 900.0f, 1.0f};
  for (float spread : spreads) {
    std::normal_distribution<float> d(0.3f * spread, spread);
    std::vector<float> v(4 * 257);
    for (size_t i = 0; i < v.size(); ++i) v[i] = i % 5 == 0 ? 0.0f : d(rng);
    out.push_back(Tensor::from_vector<float>({4, 257}, v));
  }
  return out;
}

std::string saved(const Observer& o) {
  std::ostringstream out(std::ios::binary);
  o.save_state(out);
  return out.str();
}

TEST(ObserverMerge, EveryActivationObserverEqualsTheSequentialOneForEverySplit) {
  const std::vector<Tensor> batches = batches_with_growing_range();
  ObserverOptions options;
  options.bins = 256;  // fewer bins: the test is about merging, not resolution
  options.fine_bins = 1024;
  options.search_steps = 40;
  for (const std::string& algo : activation_algos()) {
    SCOPED_TRACE(algo);
    auto sequential = make_activation_observer(algo, options);
    for (const Tensor& b : batches) sequential->observe(b);
    // Three "ranks" with contiguous blocks, merged in rank order, for several block boundaries.
    for (size_t cut1 : {1, 3, 4})
      for (size_t cut2 : {cut1, cut1 + 2, size_t{7}}) {
        auto first = make_activation_observer(algo, options), second = make_activation_observer(algo, options),
             third = make_activation_observer(algo, options);
        for (size_t i = 0; i < batches.size(); ++i) (i < cut1 ? *first : i < cut2 ? *second : *third).observe(batches[i]);
        for (const Observer* later : {second.get(), third.get()}) {
          std::istringstream in(saved(*later), std::ios::binary);
          first->merge_state(in);
        }
        EXPECT_EQ(first->observed_count(), sequential->observed_count());
        EXPECT_EQ(first->observed_batches(), sequential->observed_batches());
        EXPECT_EQ(first->observed_min(), sequential->observed_min());
        EXPECT_EQ(first->observed_max(), sequential->observed_max());
        for (QuantScheme scheme : {QuantScheme::kSymmetric, QuantScheme::kAsymmetric}) {
          const QuantParam merged = first->params(scheme), expected = sequential->params(scheme);
          EXPECT_EQ(merged.scale, expected.scale) << "cuts " << cut1 << ", " << cut2;
          EXPECT_EQ(merged.zero_point, expected.zero_point);
        }
        EXPECT_EQ(first->range().lo, sequential->range().lo);
        EXPECT_EQ(first->range().hi, sequential->range().hi);
      }
  }
}

TEST(ObserverMerge, AnEmptyShareChangesNothing) {
  const std::vector<Tensor> batches = batches_with_growing_range();
  for (const std::string& algo : activation_algos()) {
    SCOPED_TRACE(algo);
    auto seen = make_activation_observer(algo), empty = make_activation_observer(algo);
    for (const Tensor& b : batches) seen->observe(b);
    const QuantParam before = seen->params(QuantScheme::kSymmetric);
    std::istringstream in(saved(*empty), std::ios::binary);
    seen->merge_state(in);
    EXPECT_EQ(seen->params(QuantScheme::kSymmetric).scale, before.scale);
    // And the other way round: an empty first share takes the later one whole.
    auto first = make_activation_observer(algo);
    std::istringstream all(saved(*seen), std::ios::binary);
    first->merge_state(all);
    EXPECT_EQ(first->params(QuantScheme::kSymmetric).scale, before.scale);
    EXPECT_EQ(first->observed_count(), seen->observed_count());
  }
}

TEST(ObserverMerge, RefusesWeightObserversAndForeignStates) {
  auto weight = make_weight_observer("channel_wise_abs_max");
  weight->observe(Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4}));
  std::istringstream in(saved(*weight), std::ios::binary);
  EXPECT_THROW(weight->merge_state(in), Error);
  auto kl = make_activation_observer("KL"), hist = make_activation_observer("hist");
  hist->observe(Tensor::from_vector<float>({3}, {1, 2, 3}));
  std::istringstream other(saved(*hist), std::ios::binary);
  try {
    kl->merge_state(other);
    FAIL() << "merged a hist state into KL";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  }
}

TEST(Distributed, OneProcessGroupAndBlocks) {
  // Not launched by mpirun: a group of one whose collectives return their argument.
  EXPECT_EQ(distributed::size(), 1);
  EXPECT_EQ(distributed::rank(), 0);
  EXPECT_TRUE(distributed::is_root());
  EXPECT_EQ(distributed::all_reduce_sum(2.5), 2.5);
  EXPECT_EQ(distributed::all_reduce_sum(int64_t{7}), 7);
  EXPECT_EQ(distributed::gather("abc"), std::vector<std::string>{"abc"});
  EXPECT_EQ(distributed::broadcast("xyz"), "xyz");
  // 10 items over 4 ranks: 3, 3, 2, 2, contiguous and in rank order.
  size_t next = 0;
  const size_t sizes[] = {3, 3, 2, 2};
  for (int r = 0; r < 4; ++r) {
    const distributed::Range b = distributed::block_of(10, r, 4);
    EXPECT_EQ(b.begin, next);
    EXPECT_EQ(b.end - b.begin, sizes[r]);
    next = b.end;
  }
  EXPECT_EQ(distributed::block_of(2, 3, 4).end - distributed::block_of(2, 3, 4).begin, 0u);
}

}  // namespace
}  // namespace slimquant::quant

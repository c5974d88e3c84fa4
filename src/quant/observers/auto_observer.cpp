// "auto": every candidate algorithm observes each tensor from one scan; the selected one answers.
// Which candidate suits a model is decided by what its quantized outputs do (algo_choice.h), which
// an observer of one tensor cannot see, so the selection comes from outside.
#include <algorithm>

#include "quant/observers/observer_internal.h"

namespace slimquant::quant {

std::vector<std::string> auto_algo_candidates() {
  // emd first: the fixed default before "auto", kept when nothing else measures better.
  return {"emd", "KL", "mse", "hist", "avg"};
}

namespace detail {

class AutoObserver final : public Observer {
 public:
  explicit AutoObserver(const ObserverOptions& options) : Observer(/*accumulate=*/true) {
    per_sample_abs_max_ = true;  // avg's statistic, computed in the one scan
    // mse reads emd's signed histogram and hist KL's |x| histogram: two histograms filled, not four.
    auto made = [&](const std::string& name) -> const Observer& {  // a histogram's owner, made before
      for (const auto& c : candidates_)
        if (c->name() == name) return *c;
      fail(ErrorKind::kInternal, "observer auto: " + name + " must come before the candidates sharing its histogram");
    };
    for (const auto& algo : auto_algo_candidates()) {
      if (algo == "mse") candidates_.push_back(make_mse_observer_sharing(made("emd"), options));
      else if (algo == "hist") candidates_.push_back(make_hist_observer_sharing(made("KL"), options));
      else candidates_.push_back(make_activation_observer(algo, options));
    }
  }
  std::string name() const override { return "auto"; }

  void select(const std::string& algo) {
    const auto names = auto_algo_candidates();
    const auto it = std::find(names.begin(), names.end(), algo);
    SQ_CHECK(it != names.end(), ErrorKind::kInvalidArgument,
             "observer auto: '" + algo + "' is not one of its candidates");
    selected_ = static_cast<size_t>(it - names.begin());
  }

  ClipRange range() const override { return candidates_[selected_]->range(); }
  QuantParam params(QuantScheme scheme) const override { return candidates_[selected_]->params(scheme); }

 protected:
  void on_observe(const Tensor& x, const float* data, int64_t n, const BatchStats& batch) override {
    for (auto& c : candidates_) {
      // Each candidate sees the per-sample maxima only if it asks for them, as observe() would give.
      BatchStats own = batch;
      if (!c->per_sample_abs_max_) own.sample_abs_max = {};
      c->accept(x, data, n, own);
    }
  }
  ClipRange clip_range(QuantScheme) const override { return candidates_[selected_]->range(); }
  void save_algo_state(std::ostream& out) const override {
    for (const auto& c : candidates_) c->save_state(out);
  }
  void load_algo_state(std::istream& in) override {
    for (auto& c : candidates_) c->load_state(in);
  }
  void merge_algo_state(std::istream& in) override {
    for (auto& c : candidates_) c->merge_state(in);
  }

 private:
  std::vector<std::unique_ptr<Observer>> candidates_;
  size_t selected_ = 0;
};

std::unique_ptr<Observer> make_auto_observer(const ObserverOptions& o) { return std::make_unique<AutoObserver>(o); }

}  // namespace detail

bool select_auto_candidate(Observer& observer, const std::string& algo) {
  auto* automatic = dynamic_cast<detail::AutoObserver*>(&observer);
  if (automatic == nullptr) return false;
  automatic->select(algo);
  return true;
}

}  // namespace slimquant::quant

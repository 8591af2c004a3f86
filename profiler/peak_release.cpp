#include "profiler/peak_release.hpp"

#include <algorithm>
#include <limits>

namespace pipetune::profiler {

namespace {

// One record's levels as a function of the share of its time: the highest level from a share
// on (the level then, or any later one).
class SuffixLevels {
 public:
  explicit SuffixLevels(const LevelRecord& r) {
    const double duration = std::max(r.duration_ms, 0.0);
    for (const CounterSample& s : r.samples) {
      share_.push_back(duration > 0.0 ? std::clamp(s.time / duration, 0.0, 1.0) : 0.0);
      level_.push_back(s.value);
    }
    highest_after_.assign(level_.size() + 1, std::numeric_limits<std::int64_t>::min());
    for (std::size_t i = level_.size(); i-- > 0;)
      highest_after_[i] = std::max(highest_after_[i + 1], level_[i]);
    peak_ = level_.empty() ? 0 : highest_after_[0];
    // The peak is over when the change after its last sample comes (never: at the end).
    std::size_t last = 0;
    for (std::size_t i = 0; i < level_.size(); ++i)
      if (level_[i] == peak_) last = i;
    over_ = last + 1 < share_.size() ? share_[last + 1] : 1.0;
  }
  bool empty() const { return level_.empty(); }
  std::int64_t peak() const { return peak_; }
  double over() const { return over_; }
  const std::vector<double>& shares() const { return share_; }
  // The highest level from share x on: the sample in force at x and every later one.
  std::int64_t from(double x) const {
    const auto after = std::upper_bound(share_.begin(), share_.end(), x) - share_.begin();
    const std::int64_t in_force = after > 0 ? level_[after - 1] : level_.front();
    return std::max(in_force, highest_after_[after]);
  }

 private:
  std::vector<double> share_;
  std::vector<std::int64_t> level_, highest_after_;
  std::int64_t peak_ = 0;
  double over_ = 1.0;
};

}  // namespace

PeakRelease peak_release(std::span<const LevelRecord> records) {
  std::vector<SuffixLevels> levels;
  double earliest = 0.0;  // no share before every record's peak is over can drop anything
  for (const LevelRecord& r : records) {
    // A backward too short to time says nothing of when its peak ends.
    if (!(r.duration_ms > 0.0)) return {};
    SuffixLevels l(r);
    if (l.empty()) continue;
    earliest = std::max(earliest, l.over());
    levels.push_back(std::move(l));
  }
  PeakRelease best;
  if (levels.empty() || earliest >= 1.0) return best;
  std::vector<double> candidates{earliest};
  for (const SuffixLevels& l : levels)
    for (double x : l.shares())
      if (x > earliest && x < 1.0) candidates.push_back(x);
  double best_saving = 0.0;
  for (double x : candidates) {
    std::int64_t drop = std::numeric_limits<std::int64_t>::max();
    for (const SuffixLevels& l : levels) drop = std::min(drop, l.peak() - l.from(x));
    const double saving = static_cast<double>(drop) * (1.0 - x);
    if (drop > 0 && (saving > best_saving || (saving == best_saving && x < best.share))) {
      best_saving = saving;
      best = {x, drop};
    }
  }
  return best;
}

}  // namespace pipetune::profiler

// The relaxed roots' shared vocabulary: the layers' classes, the contiguity hull, the rounding
// of shares to a balance, and what boundaries' copies cost at least.

#include "sim/planner/relaxed_shares.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

namespace pipetune::planning {

namespace {

using Ranges = std::vector<std::pair<int, int>>;  // [first, end) of the layers sorted by share

// Shares that differ by rounding alone are one class: a profile whose every backward is twice
// its forward keeps one.
constexpr double kAlikeShares = 1e-9;

// `classes` equal ranges of the sorted shares, the empty ones dropped.
Ranges equal_share_ranges(const std::vector<double>& sorted, int classes) {
  const int n = static_cast<int>(sorted.size());
  Ranges ranges;
  if (n == 0) return ranges;
  const double low = sorted.front(), width = sorted.back() - low;
  auto bin = [&](int i) {
    return width > kAlikeShares
               ? std::min(classes - 1, static_cast<int>(classes * (sorted[i] - low) / width))
               : 0;
  };
  for (int i = 0, j = 0; i < n; i = j) {
    while (j < n && bin(j) == bin(i)) ++j;
    ranges.emplace_back(i, j);
  }
  return ranges;
}

// At most `classes` ranges of the sorted shares (`before`: prefix sums of their layers' work).
// A class's rows bound its forwards by its least share and its backwards by its largest, so
// each of its layers loses about its work times the class's width, whatever its own share (the
// share is a proxy: the rows also price recomputes and the last micro-batch's size). Split
// greedily: the class that loses most, at the point that loses least, between shares that are
// not alike.
Ranges least_loss_ranges(const std::vector<double>& sorted, const std::vector<double>& before,
                         int classes) {
  const int n = static_cast<int>(sorted.size());
  Ranges ranges;
  if (n == 0) return ranges;
  auto loss = [&](int i, int j) { return (before[j] - before[i]) * (sorted[j - 1] - sorted[i]); };
  // The best place to split range [i, j), -1 where all its shares are alike.
  auto best_cut = [&](int i, int j) {
    int cut = -1;
    double least = kInf;
    for (int m = i + 1; m < j; ++m) {
      if (!(sorted[m] - sorted[m - 1] > kAlikeShares)) continue;
      const double halves = loss(i, m) + loss(m, j);
      if (halves < least) least = halves, cut = m;
    }
    return cut;
  };
  ranges.emplace_back(0, n);
  std::vector<int> cuts{best_cut(0, n)};
  while (static_cast<int>(ranges.size()) < classes) {
    int worst = -1;
    for (int c = 0; c < static_cast<int>(ranges.size()); ++c) {
      if (cuts[c] >= 0 && (worst < 0 || loss(ranges[c].first, ranges[c].second) >
                                            loss(ranges[worst].first, ranges[worst].second)))
        worst = c;
    }
    if (worst < 0) break;
    const auto [i, j] = ranges[worst];
    const int cut = cuts[worst];
    ranges[worst] = {i, cut};
    cuts[worst] = best_cut(i, cut);
    ranges.emplace_back(cut, j);
    cuts.push_back(best_cut(cut, j));
  }
  return ranges;
}

}  // namespace

RatioClasses ratio_classes(const std::vector<double>& layer_work, const SizeCosts& size,
                           int max_classes, ClassSplit split) {
  const int layers = static_cast<int>(layer_work.size());
  auto share = [&](int x) {
    const double sum = size.forward_ms[x] + size.backward_ms[x];
    return sum > 0.0 ? size.forward_ms[x] / sum : 0.0;
  };
  // The layers with work by their share, and prefix sums of their work in that order.
  std::vector<int> order;
  for (int x = 0; x < layers; ++x)
    if (layer_work[x] > 0.0) order.push_back(x);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return share(a) < share(b); });
  const int n = static_cast<int>(order.size());
  std::vector<double> sorted(n), before(n + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    sorted[i] = share(order[i]);
    before[i + 1] = before[i] + layer_work[order[i]];
  }
  const Ranges ranges = split == ClassSplit::EqualRanges
                            ? equal_share_ranges(sorted, max_classes)
                            : least_loss_ranges(sorted, before, max_classes);
  std::vector<int> range(layers, 0);  // layers without work join the first range
  for (int c = 0; c < static_cast<int>(ranges.size()); ++c)
    for (int i = ranges[c].first; i < ranges[c].second; ++i) range[order[i]] = c;
  // Classes numbered as their layers first appear.
  std::vector<int> used(std::max<std::size_t>(ranges.size(), 1), -1);
  RatioClasses out;
  out.of.assign(layers, 0);
  for (int x = 0; x < layers; ++x) {
    if (used[range[x]] < 0) {
      used[range[x]] = static_cast<int>(out.work.size());
      out.work.push_back(0.0);
    }
    out.of[x] = used[range[x]];
    out.work[out.of[x]] += layer_work[x];
  }
  if (out.work.empty()) out.work.push_back(0.0);
  return out;
}

ContiguityHull::ContiguityHull(const std::vector<double>& layer_work, const RatioClasses& classes) {
  const int n_classes = static_cast<int>(classes.work.size());
  for (double w : layer_work) slack_ += w;
  slack_ *= 1e-9;
  if (n_classes < 2) return;
  lower_.resize(n_classes);
  upper_.resize(n_classes);
  for (int cls = 0; cls < n_classes; ++cls) {
    for (const double sign : {1.0, -1.0}) {  // the upper side as the lower side of -C
      Side& h = sign > 0 ? lower_[cls] : upper_[cls];
      auto push = [&](double t, double c) {
        // Keep the side convex (of sign * C): drop vertices on or above the new chord.
        while (h.t.size() >= 2) {
          const std::size_t n = h.t.size();
          const double cross = (h.t[n - 1] - h.t[n - 2]) * (sign * c - sign * h.c[n - 2]) -
                               (sign * h.c[n - 1] - sign * h.c[n - 2]) * (t - h.t[n - 2]);
          if (cross > 0.0) break;
          h.t.pop_back();
          h.c.pop_back();
        }
        if (!h.t.empty() && h.t.back() == t) {
          // Layers without work: the lower side keeps the least, the upper the most.
          if (sign * c < sign * h.c.back()) h.c.back() = c;
          return;
        }
        h.t.push_back(t);
        h.c.push_back(c);
      };
      double total = 0.0, own = 0.0;
      push(0.0, 0.0);
      for (std::size_t x = 0; x < layer_work.size(); ++x) {
        total += layer_work[x];
        if (classes.of[x] == cls) own += layer_work[x];
        push(total, own);
      }
    }
  }
}

template <typename Programme>
int ContiguityHull::add_crossed_to(Programme& programme, const std::vector<double>& shares,
                                   int stages) {
  const int n_classes = static_cast<int>(lower_.size());
  int added = 0;
  std::vector<double> so_far(n_classes, 0.0);
  for (int k = 0; k + 1 < stages; ++k) {
    double total = 0.0;
    for (int cls = 0; cls < n_classes; ++cls) {
      so_far[cls] += shares[cls * stages + k];
      total += so_far[cls];
    }
    for (int cls = 0; cls < n_classes; ++cls) {
      for (const double sign : {1.0, -1.0}) {
        const Side& h = sign > 0 ? lower_[cls] : upper_[cls];
        if (h.t.size() < 2) continue;
        const std::size_t i = std::clamp<std::size_t>(
            std::upper_bound(h.t.begin(), h.t.end(), total) - h.t.begin(), 1, h.t.size() - 1);
        const double slope = (h.c[i] - h.c[i - 1]) / (h.t[i] - h.t[i - 1]);
        const double at = h.c[i - 1] + slope * (total - h.t[i - 1]);
        if (!(sign * (so_far[cls] - at) < -slack_)) continue;
        // Once per edge: a cut the solve leaves crossed by rounding is not added again.
        if (!added_.insert({k, cls, sign > 0 ? 0 : 1, static_cast<int>(i)}).second) continue;
        // sign * (C_c - slope * T) >= sign * (c_{i-1} - slope * t_{i-1}) at end k.
        std::vector<double> a(shares.size(), 0.0);
        for (int j = 0; j <= k; ++j) {
          for (int other = 0; other < n_classes; ++other) a[other * stages + j] -= sign * slope;
          a[cls * stages + j] += sign;
        }
        // Loosened by the slack: a real end on a vertex stays inside it whatever the rounding.
        programme.add_constraint(a, sign * (h.c[i - 1] - slope * h.t[i - 1]) - slack_);
        ++added;
      }
    }
  }
  return added;
}

int ContiguityHull::add_crossed(MinMaxShareProgramme& programme, const std::vector<double>& shares,
                                int stages) {
  return add_crossed_to(programme, shares, stages);
}

int ContiguityHull::add_crossed(RootProgramme& programme, const std::vector<double>& shares,
                                int stages) {
  return add_crossed_to(programme, shares, stages);
}

std::vector<int> rounded_balance(const std::vector<double>& work,
                                 const std::vector<double>& share) {
  const int layers = static_cast<int>(work.size()) - 1;
  const int stages = static_cast<int>(share.size());
  std::vector<int> balance(stages, 0);
  double share_end = 0.0;
  for (int k = 0, start = 0; k < stages; ++k) {
    share_end += share[k];
    int end =
        static_cast<int>(std::lower_bound(work.begin(), work.end(), share_end) - work.begin());
    if (end > start && end <= layers && share_end - work[end - 1] < work[end] - share_end) --end;
    end = std::clamp(end, start + 1, layers - (stages - 1 - k));
    if (k + 1 == stages) end = layers;
    balance[k] = end - start;
    start = end;
  }
  return balance;
}

double least_boundary_bytes(const SizeCosts& size) {
  double least = kInf;
  for (std::size_t k = 0; k + 1 < size.output_bytes.size(); ++k)
    least = std::min(least, static_cast<double>(size.output_bytes[k]));
  return least;
}

double least_boundary_copies_ms(std::vector<double> weight, const std::vector<double>& ascending) {
  std::erase_if(weight, [](double w) { return !(w > 0.0); });
  std::sort(weight.begin(), weight.end(), std::greater<>());
  double ms = 0.0;
  for (std::size_t k = 0; k < std::min(weight.size(), ascending.size()); ++k)
    ms += weight[k] * ascending[k];
  return ms;
}

bool heaviest_layer_matters(const std::vector<double>& layer_work, int stages) {
  const auto heaviest = std::max_element(layer_work.begin(), layer_work.end());
  const double total = std::accumulate(layer_work.begin(), layer_work.end(), 0.0);
  return heaviest != layer_work.end() && *heaviest * stages >= 0.25 * total;
}

template <typename Programme>
double heaviest_layer_bound_of(const Programme& programme, const std::vector<double>& layer_work,
                               const RatioClasses& classes, int stages,
                               const std::vector<double>& shares, double floor,
                               std::uint64_t* cells) {
  if (!heaviest_layer_matters(layer_work, stages)) return 0.0;
  const auto heaviest = std::max_element(layer_work.begin(), layer_work.end());
  const int cls = classes.of[static_cast<std::size_t>(heaviest - layer_work.begin())];
  const std::size_t block = static_cast<std::size_t>(cls) * stages;
  std::vector<int> order(stages);
  std::iota(order.begin(), order.end(), 0);
  if (shares.size() >= block + stages) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return shares[block + x] > shares[block + y]; });
  }
  double least = kInf;
  for (int s : order) {
    least = std::min(least, programme.solve_with_least(block + s, *heaviest, cells));
    if (!(least > floor)) return 0.0;
  }
  return least < kInf ? least : 0.0;
}

double heaviest_layer_bound(const MinMaxShareProgramme& programme,
                            const std::vector<double>& layer_work, const RatioClasses& classes,
                            int stages, const std::vector<double>& shares, double floor,
                            std::uint64_t* cells) {
  return heaviest_layer_bound_of(programme, layer_work, classes, stages, shares, floor, cells);
}

double heaviest_layer_bound(const RootProgramme& programme, const std::vector<double>& layer_work,
                            const RatioClasses& classes, int stages,
                            const std::vector<double>& shares, double floor, std::uint64_t* cells) {
  return heaviest_layer_bound_of(programme, layer_work, classes, stages, shares, floor, cells);
}

}  // namespace pipetune::planning

#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

namespace pipetune {

/// The largest x in [lo, hi] with holds(x), for a predicate that holds up to some point and not
/// after it, `lo` taken to hold unchecked: lo where nothing above it does. Binary search.
template <typename Holds>
int last_holding(int lo, int hi, Holds&& holds) {
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (holds(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

/// The best split of items [0, n) into `parts` contiguous non-empty blocks, block j being
/// [bounds[j], bounds[j+1]), minimising max_j cost(j, begin_j, end_j). Exact, by dynamic
/// programming over prefixes (min_max_prefix_table). Needs cost(j, begin, end) to be
/// non-increasing in `begin` (true of sums of non-negative costs, however they are weighted per
/// block). O(parts · n · log n) cost evaluations.
///
/// torchgpipe's balancer (block partition after Bárány–Grinberg) is not optimal: [5]*8 over
/// three blocks gives [2,2,4] (bottleneck 20) where [3,3,2] reaches 15. This one is.
struct Partition {
  std::vector<int> sizes;  ///< items per block; empty when no split exists (n < parts)
  double bottleneck = std::numeric_limits<double>::infinity();
};

/// Every prefix's optimum: best[j][i] is the least bottleneck of items [0, i) in blocks 0..j
/// (infinite when i < j + 1), split[j][i] where block j begins in such a split (-1 if none).
struct MinMaxTable {
  std::vector<std::vector<double>> best;
  std::vector<std::vector<int>> split;
};

/// best[j][i] = min over t of max(best[j-1][t], cost(j, t, i)). best[j-1] need not grow with t
/// (with per-block weights a longer prefix can be cheaper: [2, 7] over speeds [2, 1] costs 7,
/// [2, 7, 2] costs 4.5), so a binary search on it alone is not exact. But a t is never better
/// than a later t' with best[j-1][t'] <= best[j-1][t], since cost(j, t', i) <= cost(j, t, i):
/// only the suffix minima of best[j-1] over [j, i) count. They are kept on a stack (best not
/// falling, cost not rising), where a binary search finds the crossing. Ties stay on the stack,
/// so where best[j-1] does not fall (one weight for every block) every t is a candidate and the
/// earliest optimal split is kept.
template <typename Cost>
MinMaxTable min_max_prefix_table(int n, int parts, Cost&& cost) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  MinMaxTable table;
  if (parts < 1 || n < 0) return table;
  auto& best = table.best;
  auto& split = table.split;
  best.assign(parts, std::vector<double>(n + 1, kInf));
  split.assign(parts, std::vector<int>(n + 1, -1));
  for (int i = 1; i <= n; ++i) best[0][i] = cost(0, 0, i), split[0][i] = 0;
  std::vector<int> minima;  // the suffix minima t in [j, i), best[j-1][t] not falling
  for (int j = 1; j < parts; ++j) {
    const std::vector<double>& before = best[j - 1];
    minima.clear();
    for (int i = j + 1; i <= n; ++i) {
      // Block j is [t, i), t in [j, i - 1]; t = i - 1 joins the candidates.
      while (!minima.empty() && before[minima.back()] > before[i - 1]) minima.pop_back();
      minima.push_back(i - 1);
      // The first candidate whose prefix dominates its block; the optimum is there or just
      // before it.
      int lo = 0, hi = static_cast<int>(minima.size()) - 1;
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (before[minima[mid]] >= cost(j, minima[mid], i)) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      for (int k = std::max(0, lo - 1); k <= lo; ++k) {
        const int t = minima[k];
        const double value = std::max(before[t], static_cast<double>(cost(j, t, i)));
        if (value < best[j][i]) best[j][i] = value, split[j][i] = t;
      }
    }
  }
  return table;
}

template <typename Cost>
Partition min_max_partition(int n, int parts, Cost&& cost) {
  Partition result;
  if (parts < 1 || n < parts) return result;
  const MinMaxTable table = min_max_prefix_table(n, parts, cost);
  result.bottleneck = table.best[parts - 1][n];
  if (result.bottleneck == std::numeric_limits<double>::infinity()) return result;
  result.sizes.assign(parts, 0);
  for (int j = parts - 1, end = n; j >= 0; --j) {
    const int begin = table.split[j][end];
    result.sizes[j] = end - begin;
    end = begin;
  }
  return result;
}

/// min_max_partition() for items of non-negative weights in blocks of given speeds (block j of
/// items [a, b) costs (prefix[b] - prefix[a]) / speed[j]), by bisection over the bottleneck: about
/// 60 probes of O(parts · log n) where the dynamic programme takes O(parts · n · log n) (1,000
/// items in 32 blocks: a few thousand evaluations a probe against 320,000 in all). A probe asks
/// whether every block can stay within T, tracking the ends blocks 0..j can reach: block j from
/// a reachable end a reaches (a, f(a)], f(a) its furthest end within T, which only grows with
/// a; so a run of reachable ends whose items each fit block j alone reaches (first, f(last)],
/// and an item too heavy for block j on its own (a slow block, a heavy item) splits the run,
/// since no block j can hold it. It compares the same doubles as the programme, so bisection
/// ends on the programme's bottleneck exactly. `hint`: where bisection starts, a lower bound
/// on the bottleneck that rounding may leave a little above it (0 if none); where it already
/// fits, bisection goes on below it.
/// The split: from the right, each block begins at the earliest reachable end it can while
/// within the bottleneck; it need not be min_max_partition()'s split (the programme also
/// balances the blocks before the last), only as good. `evaluations`, where given, is added the
/// block costs it computed (and a quarter of its table's cells), for a caller's budget.
inline Partition min_max_partition_bisected(const std::vector<double>& prefix,
                                            const std::vector<double>& speed, double hint = 0.0,
                                            std::uint64_t* evaluations = nullptr) {
  Partition result;
  const int n = static_cast<int>(prefix.size()) - 1, parts = static_cast<int>(speed.size());
  if (parts < 1 || n < parts) return result;
  std::uint64_t counted = 0;
  auto cost = [&](int j, int a, int b) {
    ++counted;
    return (prefix[b] - prefix[a]) / speed[j];
  };
  // Range maxima of the items' weights (a sparse table), to find where a run breaks.
  std::vector<std::vector<double>> heaviest(1, std::vector<double>(n));
  for (int x = 0; x < n; ++x) heaviest[0][x] = prefix[x + 1] - prefix[x];
  for (int k = 1; (1 << k) <= n; ++k) {
    const std::vector<double>& half = heaviest[k - 1];
    std::vector<double> level(n - (1 << k) + 1);
    for (std::size_t x = 0; x < level.size(); ++x)
      level[x] = std::max(half[x], half[x + (1 << (k - 1))]);
    counted += level.size() / 4;  // a table cell is a fraction of a block cost's work
    heaviest.push_back(std::move(level));
  }
  auto heaviest_in = [&](int a, int b) {  // items [a, b], a <= b
    const int k = std::bit_width(static_cast<unsigned>(b - a + 1)) - 1;
    return std::max(heaviest[k][a], heaviest[k][b - (1 << k) + 1]);
  };
  // The furthest end in [begin, most] of block j from `begin` within `limit` (begin: none).
  auto furthest = [&](int j, int begin, int most, double limit) {
    return last_holding(begin, most, [&](int end) { return cost(j, begin, end) <= limit; });
  };
  using Ends = std::vector<std::pair<int, int>>;  // disjoint runs [first, last], ascending
  std::vector<Ends> reach(parts);
  auto fits = [&](double limit) {
    Ends from{{0, 0}};
    for (int j = 0; j < parts; ++j) {
      const int most = n - (parts - 1 - j);  // leave an item for each block after j
      Ends& to = reach[j];
      to.clear();
      auto add = [&](int first, int last) {
        if (!to.empty() && to.back().second + 1 >= first) {
          to.back().second = std::max(to.back().second, last);
        } else {
          to.emplace_back(first, last);
        }
      };
      for (auto [first, last] : from) {
        last = std::min(last, most - 1);  // a start must leave block j an item
        for (int a = first; a <= last;) {
          // The starts from a on whose items fit block j alone: [a, b].
          auto fit = [&](int b) { return heaviest_in(a, b) / speed[j] <= limit; };
          const int b = fit(last) ? last : last_holding(a - 1, last, fit);  // a - 1: none
          if (b >= a) add(a + 1, std::max(b + 1, furthest(j, b, most, limit)));
          a = b + 2;  // item b + 1 is too heavy for block j: no block j starts there
        }
      }
      if (to.empty()) return false;
      from = to;
    }
    return reach[parts - 1].back().second == n;
  };
  // An equal split is within its own bottleneck.
  double hi = 0.0;
  for (int j = 0; j < parts; ++j) {
    const auto a = static_cast<int>(static_cast<long long>(n) * j / parts);
    const auto b = static_cast<int>(static_cast<long long>(n) * (j + 1) / parts);
    const double c = cost(j, a, b);
    if (!(c < std::numeric_limits<double>::infinity())) return result;  // as the programme
    hi = std::max(hi, c);
  }
  double lo = 0.0;  // fits only where every cost is 0
  if (hint > 0.0 && hint < hi) {
    if (fits(hint)) {
      hi = hint;
    } else {
      lo = hint;
    }
  }
  if (fits(lo)) {
    hi = lo;
  } else {
    while (true) {  // fits(hi), not fits(lo)
      const double mid = lo + (hi - lo) / 2;
      if (!(mid > lo && mid < hi)) break;  // adjacent doubles: hi is the least that fits
      if (fits(mid)) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
  }
  if (!fits(hi)) return result;  // the runs at the bottleneck (only a NaN cost can fail here)
  result.bottleneck = hi;
  result.sizes.assign(parts, 0);
  for (int j = parts - 1, end = n; j >= 0; --j) {
    int begin = 0;
    if (j > 0) {
      // The earliest begin within the bottleneck (every later one is too; end - 1 if none
      // before it), then the earliest end blocks 0..j-1 reach from there on; `end` is
      // reachable, so one lies before it.
      const int lo_b =
          1 + last_holding(j - 1, end - 2, [&](int b) { return cost(j, b, end) > hi; });
      begin = end;
      for (auto [first, last] : reach[j - 1]) {
        if (last < lo_b) continue;
        begin = std::max(first, lo_b);
        break;
      }
    }
    result.sizes[j] = end - begin;
    end = begin;
  }
  if (evaluations != nullptr) *evaluations += counted;
  return result;
}

}  // namespace pipetune

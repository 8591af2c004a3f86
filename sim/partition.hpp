#pragma once

#include <algorithm>
#include <limits>
#include <vector>

namespace pipetune {

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

}  // namespace pipetune

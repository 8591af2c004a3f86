// The primal form of the min-max share programme against the dual form (MinMaxShareProgramme,
// itself checked against grids and hand-solved cases): the same optimum on random programmes of
// several blocks grown one function at a time, with a coordinate held at a least share, and the
// shares it returns reach its bound.

#include "sim/planner/primal_share_programme.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "sim/planner/minimax_bound.hpp"

namespace pipetune {
namespace {

double largest_at(const std::vector<double>& constant,
                  const std::vector<std::vector<double>>& slope, const std::vector<double>& x) {
  double worst = -1e300;
  for (std::size_t i = 0; i < constant.size(); ++i) {
    double v = constant[i];
    for (std::size_t k = 0; k < x.size(); ++k) v += slope[i][k] * x[k];
    worst = std::max(worst, v);
  }
  return worst;
}

TEST(PrimalShareProgramme, GrowsToTheDualFormsOptimumWithSharesThatReachIt) {
  std::mt19937 rng(61);
  std::uniform_real_distribution<double> coef(0.0, 3.0), offset(0.0, 10.0), total(0.0, 20.0);
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE(trial);
    const std::size_t coords = 1 + rng() % 12, blocks = 1 + rng() % 4, rows = 1 + rng() % 40;
    std::vector<double> totals(blocks);
    for (double& t : totals) t = rng() % 5 == 0 ? 0.0 : total(rng);
    MinMaxShareProgramme dual(coords, totals);
    PrimalShareProgramme primal(coords, totals);
    std::vector<double> constant;
    std::vector<std::vector<double>> slope;
    for (std::size_t i = 0; i < rows; ++i) {
      constant.push_back(rng() % 4 == 0 ? 0.0 : offset(rng));
      slope.emplace_back(coords * blocks);
      // Some slopes alike, some zero: degenerate programmes as the paths make them.
      for (double& g : slope.back()) g = rng() % 3 == 0 ? std::round(coef(rng)) : coef(rng);
      dual.add(constant.back(), slope.back());
      primal.add(constant.back(), slope.back());
      if (rng() % 3 != 0 && i + 1 < rows) continue;
      std::vector<double> shares, weights;
      const double expected = dual.solve();
      const double got = primal.solve(&shares, &weights);
      const double tolerance = 1e-9 * std::max(1.0, std::abs(expected));
      EXPECT_NEAR(got, expected, tolerance);
      EXPECT_LE(got, expected + tolerance);
      // The shares are a point of the programme and its largest function is the bound there.
      for (std::size_t c = 0; c < blocks; ++c) {
        double sum = 0.0;
        for (std::size_t k = 0; k < coords; ++k) {
          EXPECT_GE(shares[c * coords + k], 0.0);
          sum += shares[c * coords + k];
        }
        EXPECT_NEAR(sum, totals[c], 1e-9 * std::max(1.0, totals[c]));
      }
      EXPECT_NEAR(largest_at(constant, slope, shares), got, 1e-7 * std::max(1.0, got));
      double weight_sum = 0.0;
      for (double w : weights) weight_sum += w;
      EXPECT_NEAR(weight_sum, 1.0, 1e-12);
    }
    // A coordinate held at a least share, from the grown basis, against the dual form's.
    const std::size_t index = rng() % (coords * blocks);
    const double least = totals[index / coords] * (rng() % 2 == 0 ? 0.5 : 1.0);
    const double expected = dual.solve_with_least(index, least);
    EXPECT_NEAR(primal.solve_with_least(index, least), expected,
                1e-9 * std::max(1.0, std::abs(expected)));
    EXPECT_EQ(primal.solve_with_least(index, totals[index / coords] + 1.0),
              std::numeric_limits<double>::infinity());
  }
}

}  // namespace
}  // namespace pipetune

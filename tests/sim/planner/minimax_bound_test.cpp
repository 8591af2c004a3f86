// The relaxed root's linear programme against hand-solved cases and a fine grid over the
// shares; its primal form (primal_share_programme.hpp) against the dual form.

#include "sim/planner/minimax_bound.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "sim/planner/primal_share_programme.hpp"

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

TEST(MinMaxShareBound, TwoDevicesOfDifferentSpeedsShareByHand) {
  // Times x0 / 2 and x1 / 1 of a total 9: equal at x0 = 6, x1 = 3, both 3.
  std::vector<double> shares;
  const double bound = min_max_share_bound({0.0, 0.0}, {{0.5, 0.0}, {0.0, 1.0}}, 9.0, &shares);
  EXPECT_NEAR(bound, 3.0, 1e-12);
  ASSERT_EQ(shares.size(), 2u);
  EXPECT_NEAR(shares[0], 6.0, 1e-9);
  EXPECT_NEAR(shares[1], 3.0, 1e-9);
}

TEST(MinMaxShareBound, PassPlusBottleneckByHand) {
  // A two-stage pipeline's rows: stage 0 is M x0 + the trip through stage 1 (x1), stage 1 the
  // pass through stage 0 plus M x1 (M = 3): 3 x0 + x1 and x0 + 3 x1 with x0 + x1 = 8 meet at
  // x0 = x1 = 4, both 16. Adding 2 to stage 0's row: 2 x0 + 10 = 24 - 2 x0 at x0 = 3.5, 17.
  EXPECT_NEAR(min_max_share_bound({0.0, 0.0}, {{3.0, 1.0}, {1.0, 3.0}}, 8.0), 16.0, 1e-12);
  EXPECT_NEAR(min_max_share_bound({2.0, 0.0}, {{3.0, 1.0}, {1.0, 3.0}}, 8.0), 17.0, 1e-12);
}

TEST(MinMaxShareBound, NegativeSlopesAndConstants) {
  // A wait's excess can lower a row as its own stage grows: -x0 + 10 and x0 - 2 with x0 + x1
  // = 20 (x1 unused): equal at x0 = 6, both 4.
  EXPECT_NEAR(min_max_share_bound({10.0, -2.0}, {{-1.0, 0.0}, {1.0, 0.0}}, 20.0), 4.0, 1e-12);
  // A row negative everywhere, least with the whole total on its falling coordinate.
  EXPECT_NEAR(min_max_share_bound({-5.0}, {{0.0, -1.0}}, 1.0), -6.0, 1e-12);
}

TEST(MinMaxShareBound, MatchesAGridOverThreeShares) {
  std::mt19937 rng(15);
  std::uniform_real_distribution<double> coef(-1.0, 3.0), offset(-5.0, 10.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int rows = 1 + static_cast<int>(rng() % 7);
    std::vector<double> constant(rows);
    std::vector<std::vector<double>> slope(rows, std::vector<double>(3));
    for (int i = 0; i < rows; ++i) {
      constant[i] = offset(rng);
      for (double& g : slope[i]) g = coef(rng);
    }
    const double total = 12.0;
    std::vector<double> shares;
    const double bound = min_max_share_bound(constant, slope, total, &shares);
    // The grid's least largest row: at least the bound, and within the grid's step of it (each
    // row moves at most 4 per unit of share and a grid point is within 1/40 per coordinate).
    const int n = 480;
    double grid = 1e300;
    for (int a = 0; a <= n; ++a) {
      for (int b = 0; a + b <= n; ++b) {
        const std::vector<double> x = {total * a / n, total * b / n, total * (n - a - b) / n};
        grid = std::min(grid, largest_at(constant, slope, x));
      }
    }
    SCOPED_TRACE(trial);
    EXPECT_LE(bound, grid + 1e-9);
    EXPECT_GE(bound, grid - 8.0 * 2 * total / n);
    // The shares it reports attain it (strong duality), within rounding.
    ASSERT_EQ(shares.size(), 3u);
    EXPECT_NEAR(shares[0] + shares[1] + shares[2], total, 1e-9);
    EXPECT_NEAR(largest_at(constant, slope, shares), bound, 1e-7);
  }
}

// Constraints on the shares (the planner's prefix bounds: stage ends confined to intervals):
// x0 and x0 + x1 each within an interval, against a grid over the shares that keeps to them.
TEST(MinMaxShareProgramme, ConstrainedSharesMatchAGrid) {
  std::mt19937 rng(18);
  std::uniform_real_distribution<double> coef(-1.0, 3.0), offset(0.0, 10.0), unit(0.0, 1.0);
  const double total = 12.0;
  int bites = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int rows = 1 + static_cast<int>(rng() % 7);
    MinMaxShareProgramme programme(3, total), free(3, total);
    std::vector<double> constant(rows);
    std::vector<std::vector<double>> slope(rows, std::vector<double>(3));
    for (int i = 0; i < rows; ++i) {
      constant[i] = offset(rng) + total;  // non-negative everywhere, as times are
      for (double& g : slope[i]) g = coef(rng);
      programme.add(constant[i], slope[i]);
      free.add(constant[i], slope[i]);
    }
    double lo0 = total * unit(rng), hi0 = total * unit(rng);
    if (lo0 > hi0) std::swap(lo0, hi0);
    const double lo1 = lo0 + (total - lo0) * unit(rng) * 0.5;
    const double hi1 = lo1 + (total - lo1) * unit(rng);
    programme.add_constraint({1, 0, 0}, lo0);
    programme.add_constraint({-1, 0, 0}, -hi0);
    programme.add_constraint({1, 1, 0}, lo1);
    programme.add_constraint({-1, -1, 0}, -hi1);
    const int n = 480;
    double grid = 1e300;
    for (int a = 0; a <= n; ++a) {
      for (int b = 0; a + b <= n; ++b) {
        const std::vector<double> x = {total * a / n, total * b / n, total * (n - a - b) / n};
        if (x[0] < lo0 - 1e-12 || x[0] > hi0 + 1e-12) continue;
        if (x[0] + x[1] < lo1 - 1e-12 || x[0] + x[1] > hi1 + 1e-12) continue;
        grid = std::min(grid, largest_at(constant, slope, x));
      }
    }
    if (grid > 1e299) continue;  // the feasible set falls between grid points
    SCOPED_TRACE(trial);
    std::vector<double> shares;
    const double bound = programme.solve(&shares);
    // The grid may miss the narrow feasible set's best point by a step either way.
    EXPECT_LE(bound, grid + 1e-9);
    EXPECT_GE(bound, grid - 8.0 * 2 * total / n);
    EXPECT_GE(shares[0], lo0 - 1e-7);
    EXPECT_LE(shares[0] + shares[1], hi1 + 1e-7);
    if (bound > free.solve() + 1e-6) ++bites;
  }
  EXPECT_GT(bites, 50);  // the constraints move the bound on many trials
}

// Moving a constraint's limit on a solved programme (what the planner's prefix programmes do
// from one stage end to the next) ends where a programme built with that limit from the start
// does; a solve with a target stops at a bound between the target and the optimum, or at the
// optimum below it; and a programme of some of the functions bounds no higher, the same where
// the dropped ones carry no weight.
TEST(MinMaxShareProgramme, MovedLimitsTargetsAndFewerFunctionsAgreeWithFreshSolves) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<double> coef(-1.0, 3.0), offset(0.0, 10.0), unit(0.0, 1.0);
  const double total = 12.0;
  int moved = 0, stopped_early = 0, dropped = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t coords = 2 + rng() % 4, rows = 2 + rng() % 25;
    std::vector<double> constant(rows);
    std::vector<std::vector<double>> slope(rows, std::vector<double>(coords));
    for (std::size_t i = 0; i < rows; ++i) {
      constant[i] = offset(rng) + total;
      for (double& g : slope[i]) g = coef(rng);
    }
    std::vector<double> a(coords, 0.0);
    a[0] = 1.0;
    auto build = [&](double lo, double hi) {
      MinMaxShareProgramme p(coords, total);
      for (std::size_t i = 0; i < rows; ++i) p.add(constant[i], slope[i]);
      p.add_constraint(a, lo);
      std::vector<double> minus(coords, 0.0);
      minus[0] = -1.0;
      p.add_constraint(minus, -hi);
      return p;
    };
    SCOPED_TRACE(trial);
    const double first = total * unit(rng);
    MinMaxShareProgramme warm = build(first, first);
    warm.solve();
    for (int step = 0; step < 5; ++step) {
      const double x0 = total * unit(rng);
      warm.set_constraint_limit(0, x0);
      warm.set_constraint_limit(1, -x0);
      const double fresh = build(x0, x0).solve();
      EXPECT_NEAR(warm.solve(), fresh, 1e-9 * std::max(1.0, std::abs(fresh)));
      ++moved;
      // A target halfway between the bound without the constraints and the optimum.
      MinMaxShareProgramme targeted = build(x0, x0);
      MinMaxShareProgramme unconstrained(coords, total);
      for (std::size_t i = 0; i < rows; ++i) unconstrained.add(constant[i], slope[i]);
      const double target = 0.5 * (unconstrained.solve() + fresh);
      const double early = targeted.solve(nullptr, nullptr, target);
      EXPECT_LE(early, fresh + 1e-9 * std::max(1.0, std::abs(fresh)));
      EXPECT_GE(early, std::min(target, fresh) - 1e-9 * std::max(1.0, std::abs(fresh)));
      if (early < fresh - 1e-6) ++stopped_early;
    }
    std::vector<double> weights;
    MinMaxShareProgramme whole(coords, total);
    for (std::size_t i = 0; i < rows; ++i) whole.add(constant[i], slope[i]);
    const double full = whole.solve(nullptr, &weights);
    std::vector<bool> weighted(rows), some(rows);
    for (std::size_t i = 0; i < rows; ++i) {
      weighted[i] = weights[i] > 0.0;
      some[i] = rng() % 2 == 0;
    }
    const double kept = whole.with_functions(weighted).solve();
    EXPECT_NEAR(kept, full, 1e-9 * std::max(1.0, std::abs(full)));
    if (std::count(some.begin(), some.end(), true) > 0) {
      EXPECT_LE(whole.with_functions(some).solve(), full + 1e-9 * std::max(1.0, std::abs(full)));
    }
    if (std::count(weighted.begin(), weighted.end(), false) > 0) ++dropped;
  }
  EXPECT_EQ(moved, 1500);
  EXPECT_GT(stopped_early, 100);  // the target stops the pivots on many of them
  EXPECT_GT(dropped, 100);        // and the weighted functions are fewer than all
}

// Cutting planes: functions added one at a time, solving in between, end where one solution of
// all of them does (the warm start changes the path, not the optimum); every intermediate bound
// is at most the final one.
TEST(MinMaxShareProgramme, GrowingOneFunctionAtATimeEndsAtTheWholeProgrammesBound) {
  std::mt19937 rng(16);
  std::uniform_real_distribution<double> coef(0.0, 3.0), offset(0.0, 10.0);
  for (int trial = 0; trial < 100; ++trial) {
    const std::size_t coords = 1 + rng() % 6, rows = 1 + rng() % 30;
    std::vector<double> constant(rows);
    std::vector<std::vector<double>> slope(rows, std::vector<double>(coords));
    for (std::size_t i = 0; i < rows; ++i) {
      constant[i] = offset(rng);
      for (double& g : slope[i]) g = coef(rng) - (i % 3 == 2 ? 1.0 : 0.0);
    }
    const double total = 20.0;
    const double whole = min_max_share_bound(constant, slope, total);
    MinMaxShareProgramme programme(coords, total);
    double last = -1e300;
    for (std::size_t i = 0; i < rows; ++i) {
      programme.add(constant[i], slope[i]);
      last = programme.solve();
      EXPECT_LE(last, whole + 1e-9 * std::abs(whole));
    }
    SCOPED_TRACE(trial);
    EXPECT_NEAR(last, whole, 1e-9 * std::max(1.0, std::abs(whole)));
  }
}

// Two totals, each shared between two coordinates (the relaxed root's classes of layers), and
// the same with one coordinate holding at least a given amount: against a grid over both
// shares.
TEST(MinMaxShareProgramme, TwoTotalsMatchAGrid) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> coef(-0.5, 3.0), offset(0.0, 10.0);
  for (int trial = 0; trial < 100; ++trial) {
    const std::size_t rows = 1 + rng() % 8;
    const std::vector<double> totals = {4.0 + rng() % 4, 2.0 + rng() % 6};
    MinMaxShareProgramme programme(2, totals);
    std::vector<double> constant(rows);
    std::vector<std::vector<double>> slope(rows, std::vector<double>(4));
    for (std::size_t i = 0; i < rows; ++i) {
      // Non-negative everywhere, as times are (the programme's premise).
      constant[i] = offset(rng) + 0.5 * (totals[0] + totals[1]);
      for (double& g : slope[i]) g = coef(rng);
      programme.add(constant[i], slope[i]);
    }
    // x = (block 0: a, W0 - a; block 1: b, W1 - b), `least` on coordinate 1 of block 1.
    const double least = 0.5 * totals[1];
    const int n = 400;
    double grid = 1e300, grid_least = 1e300;
    for (int i = 0; i <= n; ++i) {
      for (int j = 0; j <= n; ++j) {
        const double a = totals[0] * i / n, b = totals[1] * j / n;
        const std::vector<double> x = {a, totals[0] - a, b, totals[1] - b};
        const double v = largest_at(constant, slope, x);
        grid = std::min(grid, v);
        if (x[3] >= least) grid_least = std::min(grid_least, v);
      }
    }
    SCOPED_TRACE(trial);
    std::vector<double> shares;
    const double bound = programme.solve(&shares);
    const double tolerance = 3.0 * (totals[0] + totals[1]) / n;
    EXPECT_LE(bound, grid + 1e-9);
    EXPECT_GE(bound, grid - tolerance);
    ASSERT_EQ(shares.size(), 4u);
    EXPECT_NEAR(shares[0] + shares[1], totals[0], 1e-9);
    EXPECT_NEAR(shares[2] + shares[3], totals[1], 1e-9);
    EXPECT_NEAR(largest_at(constant, slope, shares), bound, 1e-7);
    const double held = programme.solve_with_least(3, least);
    EXPECT_LE(held, grid_least + 1e-9);
    EXPECT_GE(held, grid_least - tolerance);
    EXPECT_EQ(programme.solve_with_least(3, totals[1] + 1.0),
              std::numeric_limits<double>::infinity());
  }
}

// Shaped like the memory relaxation's master (MultiStagePeakBound::may_fit()): a coordinate per
// balance, a function per (device, moment) without constants, levels from 0.01 to 60, a few
// balances that pile everything on one device. The solve must end optimal, with the largest
// function at its shares equal to the bound from its weights: the two sides of the duality
// meet only at the optimum. Pivots on entries near eps (the lowest index
// among tied ratios, Bland's pivots without a tolerance) left 9 of these 200 solves short of
// an optimum and others 89 times apart; with a tolerance but without the tableau computed
// afresh from its basis, 3 % apart.
TEST(MinMaxShareProgramme, DegenerateMastersEndOptimalWithMatchingBounds) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t devices = 8 + rng() % 25, moments = 3 + rng() % 6;
    const std::size_t balances = 2 * devices + 1 + rng() % 8;
    // levels[j][k]: balance j's level at function k (device k / moments).
    std::vector<std::vector<double>> levels(balances, std::vector<double>(devices * moments));
    for (std::size_t j = 0; j < balances; ++j) {
      const std::size_t pile = j < 2 * devices ? j / 2 : devices;  // devices: none
      for (std::size_t k = 0; k < devices * moments; ++k) {
        const std::size_t d = k / moments;
        const double share = 0.3 + 0.2 * static_cast<double>(k % moments);
        // Quantised, so that levels tie as a programme's repeated states make them tie.
        const double level = pile == devices ? share * (0.8 + 0.6 * unit(rng))
                             : pile == d     ? 60.0 * share * (0.5 + unit(rng))
                                             : 0.01 + 0.05 * unit(rng);
        levels[j][k] = std::round(level * 20.0) / 20.0 + 0.01;
      }
    }
    MinMaxShareProgramme master(balances, 1.0);
    std::vector<double> slope(balances);
    std::vector<double> constant;
    std::vector<std::vector<double>> slopes;
    for (std::size_t k = 0; k < devices * moments; ++k) {
      for (std::size_t j = 0; j < balances; ++j) slope[j] = levels[j][k];
      master.add(0.0, slope);
      constant.push_back(0.0);
      slopes.push_back(slope);
    }
    std::vector<double> mix, weights;
    const double bound = master.solve(&mix, &weights);
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    ASSERT_TRUE(master.optimal());
    EXPECT_NEAR(largest_at(constant, slopes, mix), bound, 1e-7 * bound);
  }
}

// The primal form against the dual form: the same optimum on random programmes of several
// blocks grown one function at a time, with a coordinate held at a least share, and the shares
// it returns reach its bound.
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

// Constraints (the contiguity hull's cuts) added between functions, each met by a random point
// of the shares so that the programme stays feasible: the primal form ends where the dual form
// does, its shares meet every constraint, and a coordinate held at a least share agrees too.
TEST(PrimalShareProgramme, ConstraintsEndAtTheDualFormsOptimum) {
  std::mt19937 rng(62);
  std::uniform_real_distribution<double> coef(0.0, 3.0), signed_coef(-2.0, 2.0), offset(0.0, 10.0),
      total(1.0, 20.0), unit(0.0, 1.0);
  int bites = 0;
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE(trial);
    const std::size_t coords = 2 + rng() % 10, blocks = 1 + rng() % 3, rows = 2 + rng() % 30;
    std::vector<double> totals(blocks), point(coords * blocks);
    for (std::size_t c = 0; c < blocks; ++c) {
      totals[c] = total(rng);
      double sum = 0.0;
      for (std::size_t k = 0; k < coords; ++k) sum += point[c * coords + k] = unit(rng);
      for (std::size_t k = 0; k < coords; ++k) point[c * coords + k] *= totals[c] / sum;
    }
    MinMaxShareProgramme dual(coords, totals), free(coords, totals);
    PrimalShareProgramme primal(coords, totals);
    std::vector<std::vector<double>> normal;
    std::vector<double> limit;
    for (std::size_t i = 0; i < rows; ++i) {
      std::vector<double> slope(coords * blocks);
      for (double& g : slope) g = coef(rng);
      const double constant = offset(rng);
      dual.add(constant, slope);
      free.add(constant, slope);
      primal.add(constant, slope);
      if (rng() % 2 == 0) {
        std::vector<double> a(coords * blocks);
        double at_point = 0.0;
        for (std::size_t x = 0; x < a.size(); ++x) at_point += (a[x] = signed_coef(rng)) * point[x];
        const double b = at_point - unit(rng) * 0.1 * totals[0];
        dual.add_constraint(a, b);
        primal.add_constraint(a, b);
        normal.push_back(a);
        limit.push_back(b);
      }
      if (rng() % 3 != 0 && i + 1 < rows) continue;
      std::vector<double> shares, weights;
      const double expected = dual.solve();
      const double got = primal.solve(&shares, &weights);
      const double tolerance = 1e-8 * std::max(1.0, std::abs(expected));
      EXPECT_NEAR(got, expected, tolerance);
      for (std::size_t j = 0; j < normal.size(); ++j) {
        double value = 0.0;
        for (std::size_t x = 0; x < shares.size(); ++x) value += normal[j][x] * shares[x];
        EXPECT_GE(value, limit[j] - 1e-7 * std::max(1.0, std::abs(limit[j])));
      }
      EXPECT_EQ(weights.size(), primal.functions());
      EXPECT_EQ(primal.constraints(), normal.size());
    }
    if (primal.solve() > free.solve() + 1e-6) ++bites;
    const std::size_t index = rng() % (coords * blocks);
    const double least = point[index] * unit(rng);
    const double expected = dual.solve_with_least(index, least);
    EXPECT_NEAR(primal.solve_with_least(index, least), expected,
                1e-8 * std::max(1.0, std::abs(expected)));
  }
  EXPECT_GT(bites, 40);  // the constraints move the bound on many trials
}

}  // namespace
}  // namespace pipetune

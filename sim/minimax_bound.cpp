#include "sim/minimax_bound.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace pipetune {

// The dual: max sum_c total_c u_c + sum_i w_i constant[i] subject to u_c <= sum_i w_i
// slope[i][c, k] for every block c and coordinate k, sum w <= 1, w >= 0 and u free (u+ - u-).
// Every right-hand side is 0 or 1, so the slacks make a first basis.
MinMaxShareProgramme::MinMaxShareProgramme(std::size_t coordinates, std::vector<double> totals)
    : coordinates_(coordinates), totals_(std::move(totals)) {
  const std::size_t blocks = totals_.size(), rows = blocks * coordinates + 1;
  const std::size_t cols = rows + 2 * blocks;
  tableau_.assign(rows, std::vector<double>(cols, 0.0));
  rhs_.assign(rows, 0.0);
  rhs_[rows - 1] = 1.0;
  reduced_.assign(cols, 0.0);
  basis_.resize(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    tableau_[r][r] = 1.0;
    basis_[r] = r;
  }
  for (std::size_t c = 0; c < blocks; ++c) {
    for (std::size_t k = 0; k < coordinates; ++k) {
      tableau_[c * coordinates + k][rows + 2 * c] = 1.0;       // u+
      tableau_[c * coordinates + k][rows + 2 * c + 1] = -1.0;  // u-
    }
    reduced_[rows + 2 * c] = -totals_[c];
    reduced_[rows + 2 * c + 1] = totals_[c];
  }
}

void MinMaxShareProgramme::add(double constant, const std::vector<double>& slope) {
  constant_.push_back(constant);
  slope_.push_back(slope);
  const std::size_t rows = tableau_.size();
  std::vector<double> column(rows);
  for (std::size_t r = 0; r + 1 < rows; ++r) column[r] = -slope[r];
  column[rows - 1] = 1.0;  // the weights sum to at most 1
  add_column(column, constant, constant_.size() - 1);
}

void MinMaxShareProgramme::add_constraint(const std::vector<double>& a, double b) {
  limit_.push_back(b);
  constraint_.push_back(a);
  const std::size_t rows = tableau_.size();
  std::vector<double> column(rows, 0.0);  // not in the weights' sum
  for (std::size_t r = 0; r + 1 < rows; ++r) column[r] = a[r];
  add_column(column, b, ~(constraint_.size() - 1));
}

// The column in the original rows, then in the current basis: the slack columns hold the basis
// inverse, the objective row's slack entries the dual values.
void MinMaxShareProgramme::add_column(const std::vector<double>& column, double objective,
                                      std::size_t what) {
  const std::size_t rows = tableau_.size();
  for (std::size_t r = 0; r < rows; ++r) {
    double entry = 0.0;
    for (std::size_t q = 0; q < rows; ++q) entry += tableau_[r][q] * column[q];
    tableau_[r].push_back(entry);
  }
  double reduced = -objective;
  for (std::size_t q = 0; q < rows; ++q) reduced += reduced_[q] * column[q];
  reduced_.push_back(reduced);
  column_of_.push_back(what);
}

double MinMaxShareProgramme::solve(std::vector<double>* shares) {
  const std::size_t rows = tableau_.size(), cols = reduced_.size();
  if (constant_.empty()) return -std::numeric_limits<double>::infinity();
  double scale = 1.0;
  for (std::size_t i = 0; i < constant_.size(); ++i) {
    scale = std::max(scale, std::abs(constant_[i]));
    for (std::size_t r = 0; r + 1 < rows; ++r)
      scale = std::max(scale, std::abs(slope_[i][r]) * totals_[r / coordinates_]);
  }
  for (double b : limit_) scale = std::max(scale, std::abs(b));
  const double eps = 1e-12 * scale;
  // Dantzig's rule (the most negative reduced cost) takes far fewer pivots than Bland's (the
  // lowest index that improves: on a 32-stage multi-stage root, hundreds per solve), but can
  // cycle where pivots are degenerate; after a run of degenerate pivots, Bland's rule until one
  // makes progress, which it does without cycling.
  constexpr std::size_t kDegenerateRun = 32;
  std::size_t degenerate = 0;
  for (std::size_t iteration = 0; iteration < 50 * (rows + cols); ++iteration) {
    std::size_t enter = cols;
    const bool bland = degenerate >= kDegenerateRun;
    double most = -eps;
    for (std::size_t v = 0; v < cols; ++v) {
      if (reduced_[v] < most) {
        most = reduced_[v];
        enter = v;
        if (bland) break;  // the first that improves
      }
    }
    if (enter == cols) break;
    std::size_t leave = rows;
    double ratio = std::numeric_limits<double>::infinity();
    // Among rows tied at the least ratio (every one, in a degenerate start where the right-hand
    // sides are 0), Dantzig's pivots take the largest entry: pivoting on tiny ones made the
    // memory relaxation's master (MultiStagePeakBound::may_fit()) end with shares summing to
    // 15.6 instead of 1 after 10,919 pivots. Bland's need the lowest index to stop cycling.
    for (std::size_t r = 0; r < rows; ++r) {
      if (tableau_[r][enter] <= eps) continue;
      const double q = rhs_[r] / tableau_[r][enter];
      const bool tie = leave < rows && q == ratio;
      if (q < ratio || (tie && (bland ? basis_[r] < basis_[leave]
                                      : tableau_[r][enter] > tableau_[leave][enter]))) {
        ratio = q;
        leave = r;
      }
    }
    if (leave == rows) break;  // unbounded: cannot happen (u <= the slopes, w sums to 1 at most)
    degenerate = ratio > 0.0 ? 0 : degenerate + 1;
    pivot_cells_ += static_cast<std::uint64_t>(rows + 1) * cols;
    const double pivot = tableau_[leave][enter];
    for (double& x : tableau_[leave]) x /= pivot;
    rhs_[leave] /= pivot;
    auto eliminate = [&](std::vector<double>& row, double& right) {
      const double f = row[enter];
      if (f == 0.0) return;
      for (std::size_t c = 0; c < cols; ++c) row[c] -= f * tableau_[leave][c];
      right -= f * rhs_[leave];
    };
    for (std::size_t r = 0; r < rows; ++r) {
      if (r != leave) eliminate(tableau_[r], rhs_[r]);
    }
    double objective = 0.0;
    eliminate(reduced_, objective);
    basis_[leave] = enter;
  }
  // The bound from the weights and multipliers found, normalised so that the weights sum to 1
  // (the bound is positively homogeneous in both; see the header).
  const std::size_t first_weight = rows + 2 * totals_.size(), n = constant_.size();
  const std::size_t m = constraint_.size();
  std::vector<double> w(n, 0.0), mu(m, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    if (basis_[r] < first_weight) continue;
    const std::size_t what = column_of_[basis_[r] - first_weight];
    if (what < n) {
      w[what] = std::max(rhs_[r], 0.0);
    } else {
      mu[~what] = std::max(rhs_[r], 0.0);
    }
  }
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  for (double& v : w) v = sum > 0.0 ? v / sum : 1.0 / static_cast<double>(n);
  for (double& v : mu) v = sum > 0.0 ? v / sum : 0.0;
  double bound = 0.0;
  for (std::size_t i = 0; i < n; ++i) bound += w[i] * constant_[i];
  for (std::size_t j = 0; j < m; ++j) bound += mu[j] * limit_[j];
  for (std::size_t c = 0; c < totals_.size(); ++c) {
    double least = std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < coordinates_; ++k) {
      double at_k = 0.0;
      for (std::size_t i = 0; i < n; ++i) at_k += w[i] * slope_[i][c * coordinates_ + k];
      for (std::size_t j = 0; j < m; ++j) at_k -= mu[j] * constraint_[j][c * coordinates_ + k];
      least = std::min(least, at_k);
    }
    bound += totals_[c] * least;
  }
  if (shares) {
    // The dual value of each (block, coordinate) row is that coordinate's share of the block.
    shares->assign(rows - 1, 0.0);
    for (std::size_t c = 0; c < totals_.size(); ++c) {
      double block = 0.0;
      for (std::size_t k = 0; k < coordinates_; ++k)
        block += std::max(reduced_[c * coordinates_ + k], 0.0);
      for (std::size_t k = 0; k < coordinates_; ++k) {
        const double y = std::max(reduced_[c * coordinates_ + k], 0.0);
        (*shares)[c * coordinates_ + k] =
            block > 0.0 ? totals_[c] * y / block : totals_[c] / static_cast<double>(coordinates_);
      }
    }
  }
  return bound;
}

double MinMaxShareProgramme::solve_with_least(std::size_t index, double least,
                                              std::uint64_t* cells) const {
  const std::size_t block = index / coordinates_;
  if (!(least <= totals_[block])) return std::numeric_limits<double>::infinity();
  // The same programme with x[index] >= least as a constraint, from this one's basis: a copy
  // of the tableau costs less than building a fresh one (every function a column, O(rows^2)
  // each) and solving it from the slacks, which the heaviest-layer bound did once per stage.
  MinMaxShareProgramme held = *this;
  std::vector<double> a(totals_.size() * coordinates_, 0.0);
  a[index] = 1.0;
  held.add_constraint(a, least);
  const double bound = held.solve();
  if (cells != nullptr) *cells += held.pivot_cells_ - pivot_cells_;
  return bound;
}

double min_max_share_bound(const std::vector<double>& constant,
                           const std::vector<std::vector<double>>& slope, double total,
                           std::vector<double>* shares) {
  if (constant.empty()) return -std::numeric_limits<double>::infinity();
  const std::size_t coords = slope.front().size();
  // The dual's weights sum to at most 1, so a least largest function below zero would be read
  // as zero: lift every function by the same amount so that none is negative, and take it off.
  double shift = 0.0;
  for (std::size_t i = 0; i < constant.size(); ++i)
    for (std::size_t k = 0; k < coords; ++k)
      shift = std::max(shift, -(constant[i] + total * slope[i][k]));
  MinMaxShareProgramme programme(coords, total);
  for (std::size_t i = 0; i < constant.size(); ++i) programme.add(constant[i] + shift, slope[i]);
  return programme.solve(shares) - shift;
}

}  // namespace pipetune

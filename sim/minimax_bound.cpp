#include "sim/minimax_bound.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace pipetune {

// The dual: max z subject to z <= sum_i w_i value_k(i) for every coordinate k (value_k(i): the
// function i with the whole total on k) and sum w <= 1, with z, w >= 0. Every right-hand side
// is 0 or 1, so the slacks make a first basis.
MinMaxShareProgramme::MinMaxShareProgramme(std::size_t coordinates, double total)
    : coordinates_(coordinates), total_(total) {
  const std::size_t rows = coordinates + 1;
  tableau_.assign(rows, std::vector<double>(rows + 1, 0.0));
  rhs_.assign(rows, 0.0);
  rhs_[coordinates] = 1.0;
  reduced_.assign(rows + 1, 0.0);
  basis_.resize(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    tableau_[r][r] = 1.0;
    basis_[r] = r;
  }
  for (std::size_t k = 0; k < coordinates; ++k) tableau_[k][rows] = 1.0;  // z
  reduced_[rows] = -1.0;                                                  // maximise z
}

void MinMaxShareProgramme::add(double constant, const std::vector<double>& slope) {
  constant_.push_back(constant);
  slope_.push_back(slope);
  const std::size_t i = constant_.size() - 1, rows = coordinates_ + 1;
  // The weight's column in the original rows, then in the current basis: the slack columns
  // hold the basis inverse, the objective row's slack entries the dual values.
  std::vector<double> column(rows);
  for (std::size_t k = 0; k < coordinates_; ++k) column[k] = -value(i, k);
  column[coordinates_] = 1.0;
  double reduced = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    double entry = 0.0;
    for (std::size_t q = 0; q < rows; ++q) entry += tableau_[r][q] * column[q];
    tableau_[r].push_back(entry);
  }
  for (std::size_t q = 0; q < rows; ++q) reduced += reduced_[q] * column[q];
  reduced_.push_back(reduced);
}

double MinMaxShareProgramme::solve(std::vector<double>* shares) {
  const std::size_t rows = coordinates_ + 1, cols = reduced_.size();
  if (constant_.empty()) return -std::numeric_limits<double>::infinity();
  double scale = 1.0;
  for (std::size_t i = 0; i < constant_.size(); ++i)
    for (std::size_t k = 0; k < coordinates_; ++k) scale = std::max(scale, std::abs(value(i, k)));
  const double eps = 1e-12 * scale;
  for (std::size_t iteration = 0; iteration < 50 * (rows + cols); ++iteration) {
    std::size_t enter = cols;
    for (std::size_t v = 0; v < cols; ++v) {
      if (reduced_[v] < -eps) {
        enter = v;  // Bland's rule: the lowest index that improves, so no cycling
        break;
      }
    }
    if (enter == cols) break;
    std::size_t leave = rows;
    double ratio = std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < rows; ++r) {
      if (tableau_[r][enter] <= eps) continue;
      const double q = rhs_[r] / tableau_[r][enter];
      if (q < ratio || (q == ratio && basis_[r] < basis_[leave])) {
        ratio = q;
        leave = r;
      }
    }
    if (leave == rows) break;  // unbounded: cannot happen (z <= the largest value)
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
  // The bound from the weights found, normalised (see the header).
  const std::size_t first_weight = rows + 1, n = constant_.size();
  std::vector<double> w(n, 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    if (basis_[r] >= first_weight) w[basis_[r] - first_weight] = std::max(rhs_[r], 0.0);
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  for (double& v : w) v = sum > 0.0 ? v / sum : 1.0 / static_cast<double>(n);
  double bound = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < coordinates_; ++k) {
    double at_k = 0.0;
    for (std::size_t i = 0; i < n; ++i) at_k += w[i] * value(i, k);
    bound = std::min(bound, at_k);
  }
  if (shares) {
    // The dual value of each coordinate's row is the weight of that vertex: the share.
    shares->assign(coordinates_, 0.0);
    double total_dual = 0.0;
    for (std::size_t k = 0; k < coordinates_; ++k) total_dual += std::max(reduced_[k], 0.0);
    for (std::size_t k = 0; k < coordinates_; ++k)
      (*shares)[k] = total_dual > 0.0 ? total_ * std::max(reduced_[k], 0.0) / total_dual
                                      : total_ / static_cast<double>(coordinates_);
  }
  return bound;
}

double min_max_share_bound(const std::vector<double>& constant,
                           const std::vector<std::vector<double>>& slope, double total,
                           std::vector<double>* shares) {
  if (constant.empty()) return -std::numeric_limits<double>::infinity();
  const std::size_t coords = slope.front().size();
  // The functions may be negative everywhere; lift them all by the same amount so that the
  // least largest is not, and take it off again.
  double shift = 0.0;
  for (std::size_t i = 0; i < constant.size(); ++i)
    for (std::size_t k = 0; k < coords; ++k)
      shift = std::max(shift, -(constant[i] + total * slope[i][k]));
  MinMaxShareProgramme programme(coords, total);
  for (std::size_t i = 0; i < constant.size(); ++i) programme.add(constant[i] + shift, slope[i]);
  return programme.solve(shares) - shift;
}

}  // namespace pipetune

#include "sim/planner/primal_share_programme.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "sim/planner/tuning.hpp"

namespace pipetune {

namespace {
constexpr double kInfinity = std::numeric_limits<double>::infinity();
// No pivot on an entry this small (the entries are slopes, counts of tasks, and 1s).
constexpr double kPivotTolerance = 1e-9;
// Reduced costs are weights and slopes, of order 1.
constexpr double kReducedTolerance = 1e-11;
}  // namespace

PrimalShareProgramme::PrimalShareProgramme(std::size_t coordinates, std::vector<double> totals)
    : coordinates_(coordinates), width_(coordinates * totals.size()), totals_(std::move(totals)) {}

void PrimalShareProgramme::add(double constant, const std::vector<double>& slope) {
  function_row_.push_back(constant_.size());
  add_cut(constant, slope, true);
}

void PrimalShareProgramme::add_constraint(const std::vector<double>& a, double b) {
  if (function_row_.empty())
    throw std::logic_error("PrimalShareProgramme: a constraint before any function");
  if (!built_) {
    build();
    primal_pivots();
  }
  std::vector<double> slope(a.size());
  for (std::size_t k = 0; k < a.size(); ++k) slope[k] = -a[k];
  add_cut(b, std::move(slope), false);
}

void PrimalShareProgramme::add_cut(double constant, std::vector<double> slope, bool function) {
  scale_ = std::max(scale_, std::abs(constant));
  for (std::size_t k = 0; k < slope.size(); ++k)
    scale_ = std::max(scale_, std::abs(slope[k]) * totals_[k / coordinates_]);
  constant_.push_back(constant);
  slope_.push_back(std::move(slope));
  is_function_.push_back(function);
  if (built_) add_row(constant_.size() - 1);
}

// A first feasible basis: in each block all of its total on the coordinate whose largest slope
// is least, t at the largest function there, every other function's surplus basic. Only
// functions so far (add_constraint() builds before its first row).
void PrimalShareProgramme::build() {
  const std::size_t blocks = totals_.size(), functions = constant_.size();
  const std::size_t cols = 1 + width_ + blocks + functions;
  tableau_.assign(blocks + functions, std::vector<double>(cols, 0.0));
  rhs_.assign(blocks + functions, 0.0);
  basis_.assign(blocks + functions, cols);
  reduced_.assign(cols, 0.0);
  reduced_[0] = 1.0;  // minimise t
  for (std::size_t c = 0; c < blocks; ++c) {
    for (std::size_t k = 0; k < coordinates_; ++k) tableau_[c][x_column(c * coordinates_ + k)] = 1;
    tableau_[c][fixed_column(c)] = 1.0;
    rhs_[c] = totals_[c];
  }
  for (std::size_t i = 0; i < functions; ++i) {
    tableau_[blocks + i] = cut_row(i, cols);
    rhs_[blocks + i] = constant_[i];
  }
  for (std::size_t c = 0; c < blocks; ++c) {
    std::size_t best = 0;
    double least = kInfinity;
    for (std::size_t k = 0; k < coordinates_; ++k) {
      double most = -kInfinity;
      for (std::size_t i = 0; i < functions; ++i)
        most = std::max(most, slope_[i][c * coordinates_ + k]);
      if (most < least) least = most, best = k;
    }
    pivot_on(c, x_column(c * coordinates_ + best));
  }
  std::size_t top = blocks;
  for (std::size_t r = blocks; r < blocks + functions; ++r)
    if (rhs_[r] > rhs_[top]) top = r;
  pivot_on(top, 0);
  for (std::size_t i = 0; i < functions; ++i)
    if (blocks + i != top) pivot_on(blocks + i, surplus_column(i));
  built_ = true;
}

// Cut i's row as written, t - slope.x - s_i (= constant_[i]) without the t for a constraint,
// over `cols` columns.
std::vector<double> PrimalShareProgramme::cut_row(std::size_t i, std::size_t cols) const {
  std::vector<double> row(cols, 0.0);
  row[0] = is_function_[i] ? 1.0 : 0.0;
  for (std::size_t x = 0; x < width_; ++x) row[x_column(x)] = -slope_[i][x];
  row[surplus_column(i)] = -1.0;
  return row;
}

// Cut i's row in the current basis: its surplus basic there, its right-hand side negative where
// the basis's x breaks it (dual_pivots() then restores feasibility).
void PrimalShareProgramme::add_row(std::size_t i) {
  for (auto& row : tableau_) row.push_back(0.0);
  reduced_.push_back(0.0);
  const std::size_t cols = reduced_.size();
  std::vector<double> row = cut_row(i, cols);
  double rhs = constant_[i];
  for (std::size_t r = 0; r < tableau_.size(); ++r) {
    const double a = row[basis_[r]];
    if (a == 0.0) continue;
    for (std::size_t c = 0; c < cols; ++c) row[c] -= a * tableau_[r][c];
    rhs -= a * rhs_[r];
    pivot_cells_ += cols;
  }
  for (double& e : row) e = -e;
  tableau_.push_back(std::move(row));
  rhs_.push_back(-rhs);
  basis_.push_back(surplus_column(i));
}

void PrimalShareProgramme::pivot_on(std::size_t row, std::size_t column) {
  const std::size_t cols = reduced_.size();
  pivot_cells_ += static_cast<std::uint64_t>(tableau_.size() + 1) * cols;
  std::vector<double>& p = tableau_[row];
  const double pivot = p[column];
  for (double& e : p) e /= pivot;
  rhs_[row] /= pivot;
  auto eliminate = [&](std::vector<double>& other, double* right) {
    const double f = other[column];
    if (f == 0.0) return;
    for (std::size_t c = 0; c < cols; ++c) other[c] -= f * p[c];
    other[column] = 0.0;
    if (right != nullptr) *right -= f * rhs_[row];
  };
  for (std::size_t r = 0; r < tableau_.size(); ++r)
    if (r != row) eliminate(tableau_[r], &rhs_[r]);
  eliminate(reduced_, nullptr);
  basis_[row] = column;
}

// Primal simplex from a feasible basis: Dantzig's rule, Bland's after a run of degenerate
// pivots until one makes progress (as MinMaxShareProgramme does).
void PrimalShareProgramme::primal_pivots() {
  const std::size_t rows = tableau_.size(), cols = reduced_.size();
  std::size_t degenerate = 0;
  for (std::size_t iteration = 0; iteration < 50 * (rows + cols); ++iteration) {
    const bool bland = degenerate >= planning::kDegenerateRun;
    std::size_t enter = cols;
    double most = -kReducedTolerance;
    for (std::size_t j = 0; j < cols; ++j) {
      if (!may_enter(j) || !(reduced_[j] < most)) continue;
      most = reduced_[j];
      enter = j;
      if (bland) break;
    }
    if (enter == cols) return;
    std::size_t leave = rows;
    double ratio = kInfinity, largest = 0.0;
    for (std::size_t r = 0; r < rows; ++r) {
      const double a = tableau_[r][enter];
      if (!(a > kPivotTolerance)) continue;
      const double q = std::max(rhs_[r], 0.0) / a;
      if (q < ratio || (q == ratio && (bland ? basis_[r] < basis_[leave] : a > largest))) {
        ratio = q;
        largest = a;
        leave = r;
      }
    }
    if (leave == rows) return;  // unbounded below: not for non-negative times
    degenerate = ratio > 0.0 ? 0 : degenerate + 1;
    pivot_on(leave, enter);
  }
}

// Dual simplex from a basis whose reduced costs are all non-negative (an optimum before rows
// were added or right-hand sides moved): the most negative right-hand side leaves.
void PrimalShareProgramme::dual_pivots() {
  const std::size_t rows = tableau_.size(), cols = reduced_.size();
  const double feasible = -1e-12 * scale_;
  for (std::size_t iteration = 0; iteration < 50 * (rows + cols); ++iteration) {
    // The row most infeasible per unit of its length (steepest edge, with the rows' norms
    // computed afresh: few rows are infeasible at once).
    std::size_t leave = rows;
    double lowest = 0.0;
    for (std::size_t r = 0; r < rows; ++r) {
      if (!(rhs_[r] < feasible)) continue;
      double norm = 1.0;
      for (double e : tableau_[r]) norm += e * e;
      pivot_cells_ += cols;
      const double scaled = rhs_[r] / std::sqrt(norm);
      if (scaled < lowest) lowest = scaled, leave = r;
    }
    if (leave == rows) return;
    const std::vector<double>& row = tableau_[leave];
    std::size_t enter = cols;
    double ratio = kInfinity, largest = 0.0;
    for (std::size_t j = 0; j < cols; ++j) {
      if (!may_enter(j) || !(row[j] < -kPivotTolerance)) continue;
      const double q = std::max(reduced_[j], 0.0) / -row[j];
      if (q < ratio || (q == ratio && -row[j] > largest)) {
        ratio = q;
        largest = -row[j];
        enter = j;
      }
    }
    if (enter == cols) return;  // no x meets the row: not for these programmes
    pivot_on(leave, enter);
  }
}

double PrimalShareProgramme::read(std::vector<double>* shares, std::vector<double>* weights) {
  // The cuts' dual values: the functions' weights w, the constraints' multipliers, both scaled
  // so that w sums to 1.
  const std::size_t cuts = constant_.size();
  std::vector<double> y(cuts);
  double sum = 0.0;
  for (std::size_t i = 0; i < cuts; ++i) {
    y[i] = std::max(reduced_[surplus_column(i)], 0.0);
    if (is_function_[i]) sum += y[i];
  }
  for (std::size_t i = 0; i < cuts; ++i) {
    if (sum > 0.0)
      y[i] /= sum;
    else if (is_function_[i])
      y[i] = 1.0 / static_cast<double>(functions());
  }
  std::vector<double> priced(width_, 0.0);
  double bound = 0.0;
  for (std::size_t i = 0; i < cuts; ++i) {
    if (y[i] == 0.0) continue;
    bound += y[i] * constant_[i];
    for (std::size_t x = 0; x < width_; ++x) priced[x] += y[i] * slope_[i][x];
  }
  pivot_cells_ += cuts * width_;
  for (std::size_t c = 0; c < totals_.size(); ++c) {
    const auto first = priced.begin() + static_cast<std::ptrdiff_t>(c * coordinates_);
    bound +=
        totals_[c] * *std::min_element(first, first + static_cast<std::ptrdiff_t>(coordinates_));
  }
  if (shares != nullptr) {
    shares->assign(width_, 0.0);
    for (std::size_t r = 0; r < basis_.size(); ++r) {
      if (basis_[r] >= x_column(0) && basis_[r] < x_column(width_))
        (*shares)[basis_[r] - x_column(0)] = std::max(rhs_[r], 0.0);
    }
  }
  if (weights != nullptr) {
    weights->resize(functions());
    for (std::size_t i = 0; i < functions(); ++i) (*weights)[i] = y[function_row_[i]];
  }
  return bound;
}

double PrimalShareProgramme::solve(std::vector<double>* shares, std::vector<double>* weights) {
  if (function_row_.empty()) return -kInfinity;
  if (!built_) {
    build();
  } else {
    dual_pivots();
  }
  primal_pivots();
  return read(shares, weights);
}

double PrimalShareProgramme::solve_with_least(std::size_t index, double least,
                                              std::uint64_t* cells) const {
  const std::size_t block = index / coordinates_;
  if (!(least <= totals_[block])) return kInfinity;
  // x[index] = least + x': the block's total falls by `least` and each function's constant
  // rises by its slope there. Only the right-hand sides move, by the basis inverse (the fixed
  // columns for the blocks' rows, the surpluses' negated for the functions'), so the basis stays
  // dual feasible and the dual simplex goes on from it.
  PrimalShareProgramme held = *this;
  held.pivot_cells_ += held.tableau_.size() * held.reduced_.size();  // the copy
  held.totals_[block] -= least;
  for (std::size_t i = 0; i < held.constant_.size(); ++i)
    held.constant_[i] += held.slope_[i][index] * least;
  if (held.built_) {
    for (std::size_t r = 0; r < held.tableau_.size(); ++r) {
      const std::vector<double>& row = held.tableau_[r];
      double change = -least * row[fixed_column(block)];
      for (std::size_t i = 0; i < held.constant_.size(); ++i)
        change -= slope_[i][index] * least * row[surplus_column(i)];
      held.rhs_[r] += change;
    }
    held.pivot_cells_ += held.tableau_.size() * (held.constant_.size() + 1);
  }
  const double bound = held.solve();
  if (cells != nullptr) *cells += held.pivot_cells_ - pivot_cells_;
  return bound;
}

}  // namespace pipetune

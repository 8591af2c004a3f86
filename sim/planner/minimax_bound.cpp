#include "sim/planner/minimax_bound.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "sim/planner/tuning.hpp"

namespace pipetune {

namespace {
// How far below 0 Harris's ratio test lets a right-hand side go (weights, which sum to at most 1,
// and the bounds' parts and multipliers, of the programme's scale).
constexpr double kHarrisSlack = 1e-9;
}  // namespace

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
  scale_ = std::max(scale_, std::abs(constant));
  for (std::size_t r = 0; r < slope.size(); ++r)
    scale_ = std::max(scale_, std::abs(slope[r]) * totals_[r / coordinates_]);
  constant_.push_back(constant);
  slope_.push_back(slope);
  add_column(constant_.size() - 1);
}

void MinMaxShareProgramme::add_constraint(const std::vector<double>& a, double b) {
  scale_ = std::max(scale_, std::abs(b));
  limit_.push_back(b);
  constraint_.push_back(a);
  constraint_column_.push_back(tableau_.size() + 2 * totals_.size() + column_of_.size());
  add_column(~(constraint_.size() - 1));
}

// The multiplier's objective coefficient moves by the change in b: its reduced cost too, and,
// where it is basic, every reduced cost by its row of the tableau.
void MinMaxShareProgramme::set_constraint_limit(std::size_t j, double b) {
  const double delta = b - limit_[j];
  if (delta == 0.0) return;
  scale_ = std::max(scale_, std::abs(b));
  limit_[j] = b;
  const std::size_t column = constraint_column_[j];
  reduced_[column] -= delta;
  for (std::size_t r = 0; r < basis_.size(); ++r) {
    if (basis_[r] != column) continue;
    for (std::size_t c = 0; c < reduced_.size(); ++c) reduced_[c] += delta * tableau_[r][c];
    pivot_cells_ += reduced_.size();
  }
  optimal_ = false;
}

double MinMaxShareProgramme::column_objective(std::size_t column) const {
  const std::size_t rows = tableau_.size(), first_weight = rows + 2 * totals_.size();
  if (column < rows) return 0.0;  // a slack
  if (column < first_weight) {
    const std::size_t c = (column - rows) / 2;
    return (column - rows) % 2 == 0 ? totals_[c] : -totals_[c];  // u+, u-
  }
  return objective_of(column_of_[column - first_weight]);
}

double MinMaxShareProgramme::basis_value() const {
  double value = 0.0;
  for (std::size_t r = 0; r < basis_.size(); ++r) value += column_objective(basis_[r]) * rhs_[r];
  return value;
}

std::vector<double> MinMaxShareProgramme::original_column(std::size_t what) const {
  const std::size_t rows = tableau_.size();
  const bool function = what < constant_.size();
  std::vector<double> column(rows);
  for (std::size_t r = 0; r + 1 < rows; ++r)
    column[r] = function ? -slope_[what][r] : constraint_[~what][r];
  column[rows - 1] = function ? 1.0 : 0.0;  // only the weights sum to at most 1
  return column;
}

double MinMaxShareProgramme::objective_of(std::size_t what) const {
  return what < constant_.size() ? constant_[what] : limit_[~what];
}

// The column in the original rows, then in the current basis: the slack columns hold the basis
// inverse, the objective row's slack entries the dual values.
void MinMaxShareProgramme::add_column(std::size_t what) {
  const std::vector<double> column = original_column(what);
  const std::size_t rows = tableau_.size();
  // Four rows at a time: each row's sum still adds its terms in order (the same bits), but the
  // four chains of additions overlap instead of each waiting on its last addition (this
  // product was a fifth of a capped 3,000-layer search).
  std::size_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const double *a = tableau_[r].data(), *b = tableau_[r + 1].data(), *c = tableau_[r + 2].data(),
                 *d = tableau_[r + 3].data();
    double ea = 0.0, eb = 0.0, ec = 0.0, ed = 0.0;
    for (std::size_t q = 0; q < rows; ++q) {
      const double x = column[q];
      ea += a[q] * x;
      eb += b[q] * x;
      ec += c[q] * x;
      ed += d[q] * x;
    }
    tableau_[r].push_back(ea);
    tableau_[r + 1].push_back(eb);
    tableau_[r + 2].push_back(ec);
    tableau_[r + 3].push_back(ed);
  }
  for (; r < rows; ++r) {
    double entry = 0.0;
    for (std::size_t q = 0; q < rows; ++q) entry += tableau_[r][q] * column[q];
    tableau_[r].push_back(entry);
  }
  double reduced = -objective_of(what);
  for (std::size_t q = 0; q < rows; ++q) reduced += reduced_[q] * column[q];
  reduced_.push_back(reduced);
  column_of_.push_back(what);
}

double MinMaxShareProgramme::solve(std::vector<double>* shares, std::vector<double>* weights,
                                   double target) {
  if (constant_.empty()) return -std::numeric_limits<double>::infinity();
  const double scale = scale_;
  std::size_t pivots_left = pivot_limit_;
  pivot_to_optimum(scale, &pivots_left, target);
  std::vector<double> x;
  double bound = read_solution(&x, weights);
  // Reading the bound walks the basic weights and multipliers once per coordinate.
  pivot_cells_ += tableau_.size() * tableau_.size();
  // An optimum's shares reach its bound: the largest function there is the bound. Where
  // rounding in the pivots left them apart (on degenerate masters of the memory relaxation,
  // by up to 3 %), the tableau is computed afresh from its basis and the pivots go on (twice
  // at most). Skipped with constraints (the shares must meet them too).
  for (int again = 0; again < 2 && optimal_ && limit_.empty(); ++again) {
    double largest = -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < constant_.size(); ++i) {
      double at = constant_[i];
      for (std::size_t k = 0; k < x.size(); ++k) at += slope_[i][k] * x[k];
      largest = std::max(largest, at);
    }
    if (largest - bound <= 1e-9 * scale || !refactor()) break;
    pivot_to_optimum(scale, &pivots_left, target);
    bound = read_solution(&x, weights);
  }
  if (shares) *shares = std::move(x);
  return bound;
}

// The row that leaves the basis as column `enter` enters, `rows` where none may (the
// programme is unbounded), and its ratio.
std::size_t MinMaxShareProgramme::leaving_row(std::size_t enter, bool bland, double pivot_tolerance,
                                              double& ratio) const {
  const std::size_t rows = tableau_.size();
  std::size_t leave = rows;
  if (bland) {
    // The least ratio, ties to the lowest index: what stops Bland's pivots cycling.
    for (std::size_t r = 0; r < rows; ++r) {
      if (tableau_[r][enter] <= pivot_tolerance) continue;
      const double q = rhs_[r] / tableau_[r][enter];
      if (q < ratio || (q == ratio && basis_[r] < basis_[leave])) {
        ratio = q;
        leave = r;
      }
    }
  } else {
    // Harris's ratio test: the largest entry among the rows whose ratio is within a
    // tolerance of the least. The lowest index among exact ties (every row, in the
    // degenerate start where the right-hand sides are 0) pivoted on entries near eps and blew
    // the tableau up: the memory relaxation's master (MultiStagePeakBound::may_fit()) ended
    // with shares summing to 15.6 instead of 1, or with a column of reduced cost -18,008 and
    // no positive entry.
    double reach = std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < rows; ++r) {
      if (tableau_[r][enter] > pivot_tolerance)
        reach = std::min(reach, (std::max(rhs_[r], 0.0) + kHarrisSlack) / tableau_[r][enter]);
    }
    double largest = 0.0;
    for (std::size_t r = 0; r < rows; ++r) {
      const double a = tableau_[r][enter];
      if (a > pivot_tolerance && std::max(rhs_[r], 0.0) / a <= reach && a > largest) {
        largest = a;
        leave = r;
      }
    }
    if (leave < rows) ratio = std::max(rhs_[leave], 0.0) / largest;
  }
  return leave;
}

// Pivots on row `leave` and column `enter`: the row scaled to a 1 there, the column eliminated
// from every other row and from the reduced costs.
void MinMaxShareProgramme::pivot_on(std::size_t leave, std::size_t enter) {
  const std::size_t rows = tableau_.size(), cols = reduced_.size();
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
}

void MinMaxShareProgramme::pivot_to_optimum(double scale, std::size_t* pivots_left, double target) {
  const std::size_t rows = tableau_.size(), cols = reduced_.size();
  const double eps = 1e-12 * scale;
  // No pivot on an entry this small: in a degenerate run Bland's pivots took entries near eps
  // and blew the tableau up (a memory master's entries reached -399,215). Below 1e-8 x scale
  // some of the masters of bench's capped 1,000-layer profile still ended short of an optimum.
  const double pivot_tolerance = 1e-8 * scale;
  // Dantzig's rule (the most negative reduced cost) takes far fewer pivots than Bland's (the
  // lowest index that improves: on a 32-stage multi-stage root, hundreds per solve), but can
  // cycle where pivots are degenerate; after a run of degenerate pivots, Bland's rule until one
  // makes progress, which it does without cycling.
  std::size_t degenerate = 0;
  optimal_ = false;
  const std::size_t pivots = std::min<std::size_t>(50 * (rows + cols), *pivots_left);
  // A feasible basis bounds already: where the last one reaches the target (a sibling's, its
  // limits moved), no pivot is needed to say so.
  if (target < std::numeric_limits<double>::infinity() && basis_value() >= target) return;
  for (std::size_t iteration = 0; iteration < pivots; ++iteration, --*pivots_left) {
    std::size_t enter = cols;
    const bool bland = degenerate >= planning::kDegenerateRun;
    double most = -eps;
    for (std::size_t v = 0; v < cols; ++v) {
      if (reduced_[v] < most) {
        most = reduced_[v];
        enter = v;
        if (bland) break;  // the first that improves
      }
    }
    if (enter == cols) {
      optimal_ = true;
      break;
    }
    double ratio = std::numeric_limits<double>::infinity();
    const std::size_t leave = leaving_row(enter, bland, pivot_tolerance, ratio);
    if (leave == rows) break;  // unbounded: cannot happen (u <= the slopes, w sums to 1 at most)
    degenerate = ratio > 0.0 ? 0 : degenerate + 1;
    pivot_on(leave, enter);
    basis_[leave] = enter;
    for (double& b : rhs_) b = std::max(b, 0.0);  // Harris's slack can leave a row just below 0
    // The weights sum to at most 1 and the value is positively homogeneous in them, so a value
    // at the target is one once normalised (when positive, as times are).
    if (target < std::numeric_limits<double>::infinity() && basis_value() >= target) break;
  }
}

// The weights and multipliers in the basis, the bound they give and the shares (the dual values
// of the coordinate rows).
double MinMaxShareProgramme::read_solution(std::vector<double>* shares,
                                           std::vector<double>* weights) const {
  const std::size_t rows = tableau_.size();
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
  if (weights) *weights = w;
  // Only the basic ones can be non-zero (at most one per row).
  std::vector<std::size_t> used_w, used_mu;
  for (std::size_t i = 0; i < n; ++i)
    if (w[i] != 0.0) used_w.push_back(i);
  for (std::size_t j = 0; j < m; ++j)
    if (mu[j] != 0.0) used_mu.push_back(j);
  double bound = 0.0;
  for (std::size_t i : used_w) bound += w[i] * constant_[i];
  for (std::size_t j : used_mu) bound += mu[j] * limit_[j];
  for (std::size_t c = 0; c < totals_.size(); ++c) {
    double least = std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < coordinates_; ++k) {
      double at_k = 0.0;
      for (std::size_t i : used_w) at_k += w[i] * slope_[i][c * coordinates_ + k];
      for (std::size_t j : used_mu) at_k -= mu[j] * constraint_[j][c * coordinates_ + k];
      least = std::min(least, at_k);
    }
    bound += totals_[c] * least;
  }
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
  return bound;
}

// The tableau, right-hand sides and reduced costs from the original columns and the current
// basis (Gauss-Jordan with partial pivoting on the basis columns), dropping the rounding the
// pivots accumulated. False, and nothing changed, when the basis is singular to rounding.
bool MinMaxShareProgramme::refactor() {
  const std::size_t rows = tableau_.size(), cols = reduced_.size();
  const std::size_t blocks = totals_.size(), first_weight = rows + 2 * blocks;
  // The original programme: columns (slacks, u+ and u- per block, then the added ones), the
  // right-hand sides, and each column's cost as the first tableau had it.
  std::vector<std::vector<double>> a(rows, std::vector<double>(cols + 1, 0.0));
  std::vector<double> cost(cols, 0.0);
  for (std::size_t r = 0; r < rows; ++r) a[r][r] = 1.0;
  for (std::size_t c = 0; c < blocks; ++c) {
    for (std::size_t k = 0; k < coordinates_; ++k) {
      a[c * coordinates_ + k][rows + 2 * c] = 1.0;
      a[c * coordinates_ + k][rows + 2 * c + 1] = -1.0;
    }
    cost[rows + 2 * c] = -totals_[c];
    cost[rows + 2 * c + 1] = totals_[c];
  }
  for (std::size_t j = first_weight; j < cols; ++j) {
    const std::size_t what = column_of_[j - first_weight];
    const std::vector<double> column = original_column(what);
    for (std::size_t r = 0; r < rows; ++r) a[r][j] = column[r];
    cost[j] = -objective_of(what);
  }
  a[rows - 1][cols] = 1.0;  // the right-hand sides: the weights sum to at most 1
  for (std::size_t k = 0; k < rows; ++k) {
    const std::size_t v = basis_[k];
    std::size_t p = k;
    for (std::size_t r = k + 1; r < rows; ++r)
      if (std::abs(a[r][v]) > std::abs(a[p][v])) p = r;
    if (std::abs(a[p][v]) < 1e-12) return false;
    std::swap(a[p], a[k]);
    const double pivot = a[k][v];
    for (double& e : a[k]) e /= pivot;
    for (std::size_t r = 0; r < rows; ++r) {
      const double f = a[r][v];
      if (r == k || f == 0.0) continue;
      for (std::size_t c = 0; c <= cols; ++c) a[r][c] -= f * a[k][c];
    }
  }
  pivot_cells_ += static_cast<std::uint64_t>(rows) * rows * (cols + 1);
  for (std::size_t r = 0; r < rows; ++r) {
    rhs_[r] = std::max(a[r][cols], 0.0);
    a[r].pop_back();
    tableau_[r] = std::move(a[r]);
  }
  reduced_ = cost;
  for (std::size_t r = 0; r < rows; ++r) {
    const double cb = cost[basis_[r]];
    if (cb == 0.0) continue;
    for (std::size_t c = 0; c < cols; ++c) reduced_[c] -= cb * tableau_[r][c];
  }
  return true;
}

MinMaxShareProgramme MinMaxShareProgramme::with_functions(const std::vector<bool>& keep) const {
  MinMaxShareProgramme out(coordinates_, totals_);
  out.pivot_limit_ = pivot_limit_;
  for (std::size_t i = 0; i < constant_.size(); ++i)
    if (keep[i]) out.add(constant_[i], slope_[i]);
  for (std::size_t j = 0; j < limit_.size(); ++j) out.add_constraint(constraint_[j], limit_[j]);
  out.solve();
  return out;
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

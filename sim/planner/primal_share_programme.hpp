#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pipetune {

/// MinMaxShareProgramme's problem, the least largest of some linear functions of x >= 0 whose
/// blocks each sum to their total, solved in its primal form: a row per function and per block,
/// a column per coordinate. The dual form has a row per coordinate, so each pivot and each
/// function added costs about coordinates^2 cells; here a pivot costs (functions + blocks) x
/// (coordinates + functions), and a function added is a row that a few dual simplex pivots
/// make feasible again. For programmes of many coordinates and few functions: the multi-stage
/// relaxed roots (stages x classes coordinates, tens of paths; on 64 stages the dual form's
/// first solve took about 1,600 pivots of 85 k cells).
///
/// The value solve() returns is recomputed from the functions' weights the basis gives (the
/// dual values, each at least 0 and normalised to sum to 1) and the constraints' multipliers
/// m_j >= 0 (scaled alike): sum_i w_i constant[i] + sum_j m_j b_j + sum_c total_c * min_k over
/// block c of (sum_i w_i slope[i][k] - sum_j m_j a_j[k]), a bound for every such w and m, so
/// rounding in the pivots can make it a little lower, never invalid. Needs the least largest
/// function to be non-negative (true of times): the largest is a variable t >= 0.
class PrimalShareProgramme {
 public:
  PrimalShareProgramme(std::size_t coordinates, std::vector<double> totals);
  /// `slope`: coordinates x totals entries, block by block.
  void add(double constant, const std::vector<double>& slope);
  /// Restricts the shares to  a . x >= b  (a laid out as the slopes): a row that a few dual
  /// simplex pivots make feasible, as a function's. Needs a function added before it; the
  /// first constraint solves the functions so far, the start build() needs being theirs alone.
  void add_constraint(const std::vector<double>& a, double b);
  std::size_t constraints() const { return constant_.size() - functions(); }
  /// `shares`, if given, receives the x of the optimal basis; `weights` the functions' weights
  /// the bound is recomputed from. -infinity without functions.
  double solve(std::vector<double>* shares = nullptr, std::vector<double>* weights = nullptr);
  /// The bound of the same functions when coordinate `index` (block * coordinates + k) holds at
  /// least `least` of its block's total, solved on from this one's basis (only the right-hand
  /// sides move); infinity when the block is smaller. Adds its pivot cells to `*cells`.
  double solve_with_least(std::size_t index, double least, std::uint64_t* cells = nullptr) const;
  std::size_t functions() const { return function_row_.size(); }
  double constant(std::size_t i) const { return constant_[function_row_[i]]; }
  const std::vector<double>& slope(std::size_t i) const { return slope_[function_row_[i]]; }
  /// Tableau cells the pivots and rows so far have updated: what the solves cost.
  std::uint64_t pivot_cells() const { return pivot_cells_; }

 private:
  // Columns: t (the largest function), x block after block, one fixed column per block (its
  // row's column of the basis inverse; it never enters), then each cut's surplus s_i. Rows: one
  // per block (sum of its x = total), then one per cut in the order added: a function's
  // t - slope.x - s = c, a constraint's a.x - s = b (kept as slope -a, constant b, no t).
  std::size_t x_column(std::size_t index) const { return 1 + index; }
  std::size_t fixed_column(std::size_t block) const { return 1 + width_ + block; }
  std::size_t surplus_column(std::size_t i) const { return 1 + width_ + totals_.size() + i; }
  bool may_enter(std::size_t column) const {
    return column < fixed_column(0) || column >= surplus_column(0);
  }
  std::vector<double> cut_row(std::size_t i, std::size_t cols) const;
  void add_cut(double constant, std::vector<double> slope, bool function);
  void build();
  void add_row(std::size_t i);
  void pivot_on(std::size_t row, std::size_t column);
  void primal_pivots();
  void dual_pivots();
  double read(std::vector<double>* shares, std::vector<double>* weights);

  std::size_t coordinates_, width_;
  std::vector<double> totals_;
  // Per cut (function or constraint), in the order added; function_row_ names the functions'.
  std::vector<double> constant_;
  std::vector<std::vector<double>> slope_;
  std::vector<bool> is_function_;
  std::vector<std::size_t> function_row_;
  std::vector<std::vector<double>> tableau_;
  std::vector<double> rhs_, reduced_;
  std::vector<std::size_t> basis_;
  double scale_ = 1.0;
  bool built_ = false;
  std::uint64_t pivot_cells_ = 0;
};

}  // namespace pipetune

#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace pipetune {

/// A lower bound on  min over x >= 0 with sum(x) = total  of  max_i (constant[i] + slope[i] . x):
/// the least possible largest of some linear functions when a fixed total is shared out among
/// the coordinates of x. The planner's relaxed root bound (docs/planner.md) has this shape:
/// x is the work each stage gets, each function a lower bound on the iteration time.
///
/// Solved through the dual: for weights w >= 0 summing to 1, sum_i w_i (constant[i] +
/// slope[i] . x) is at most the largest function at every x, and it is least at a vertex, all of
/// the total on one coordinate. So  sum_i w_i constant[i] + total * min_k sum_i w_i slope[i][k]
/// is a bound for every w; a simplex method finds the best w, and the value returned is
/// recomputed from those weights, so rounding in the pivots can make the bound a little
/// lower, never invalid. Exact (up to rounding) for the continuous problem.
///
/// `slope[i]` has one entry per coordinate (all the same length); returns -infinity for no
/// functions. `shares`, if given, receives the x that attains the bound (the primal solution).
double min_max_share_bound(const std::vector<double>& constant,
                           const std::vector<std::vector<double>>& slope, double total,
                           std::vector<double>* shares = nullptr);

/// The same programme with several totals, each shared out on its own (x = one block of
/// coordinates per total, each block summing to its total), grown one function at a time
/// (cutting planes): each solve() goes on from the last optimal basis, so a new function costs
/// a few pivots instead of a new solution. Slopes are laid out block after block. The dual
/// bound is  sum_i w_i constant[i] + sum_c total_c * min_k over block c of sum_i w_i slope[i][k].
/// Needs the least largest function to be non-negative (true of times); below zero solve()
/// still returns a bound, only a weaker one.
class MinMaxShareProgramme {
 public:
  MinMaxShareProgramme(std::size_t coordinates, std::vector<double> totals);
  MinMaxShareProgramme(std::size_t coordinates, double total)
      : MinMaxShareProgramme(coordinates, std::vector<double>{total}) {}
  /// `slope`: coordinates x totals entries, block by block.
  void add(double constant, const std::vector<double>& slope);
  /// Restricts the shares to  a . x >= b  (a laid out as the slopes). Through the dual: a
  /// multiplier m >= 0 per constraint, and the bound becomes  sum_i w_i constant[i] + sum_j m_j
  /// b_j + sum_c total_c * min_k over block c of (sum_i w_i slope[i][k] - sum_j m_j a_j[k]),
  /// recomputed from the weights and multipliers found, so it stays a bound whatever the
  /// rounding.
  void add_constraint(const std::vector<double>& a, double b);
  /// Constraint j's b, as set last: changing it moves only the objective of the dual, whose
  /// basis stays feasible, so the next solve() goes on from it (a branch and bound that tries
  /// one constraint's values in turn pays a few pivots each, not a copy and a fresh column).
  void set_constraint_limit(std::size_t j, double b);
  std::size_t constraints() const { return limit_.size(); }
  /// `weights`, if given, receives the functions' weights w (summing to 1) the bound is
  /// recomputed from. `target`: the pivots may stop once the dual's value reaches it (a caller
  /// that only asks whether the bound rules something out); the bound returned is still
  /// recomputed from the weights and multipliers reached.
  double solve(std::vector<double>* shares = nullptr, std::vector<double>* weights = nullptr,
               double target = std::numeric_limits<double>::infinity());
  /// At most this many pivots per solve() from now on (besides its own limit, 50 per row and
  /// column); optimal() says whether the last solve() ended at an optimal basis.
  void limit_pivots(std::size_t pivots) { pivot_limit_ = pivots; }
  bool optimal() const { return optimal_; }
  /// The bound of the same functions when coordinate `index` (block * coordinates + k) holds
  /// at least `least` of its block's total (a constraint on a copy, solved on from this one's
  /// basis); infinity when the block is smaller.
  /// Adds that solution's pivot cells (see pivot_cells()) to `*cells` where given.
  double solve_with_least(std::size_t index, double least, std::uint64_t* cells = nullptr) const;
  std::size_t functions() const { return constant_.size(); }
  /// A programme of the functions where `keep` is true and every constraint, solved from the
  /// slacks: its bound is at most this one's (fewer functions), a cheaper start for copies
  /// that go on adding their own.
  MinMaxShareProgramme with_functions(const std::vector<bool>& keep) const;
  /// Function i as added.
  double constant(std::size_t i) const { return constant_[i]; }
  const std::vector<double>& slope(std::size_t i) const { return slope_[i]; }
  /// Tableau cells the pivots so far have updated: what the solves cost, for a caller's budget.
  std::uint64_t pivot_cells() const { return pivot_cells_; }
  /// Cells of the tableau: what a copy costs.
  std::uint64_t tableau_cells() const {
    return static_cast<std::uint64_t>(tableau_.size()) * reduced_.size();
  }

 private:
  std::size_t coordinates_;
  std::vector<double> totals_;
  std::vector<double> constant_;
  std::vector<std::vector<double>> slope_;
  std::vector<double> limit_;                    // the constraints' b
  std::vector<std::vector<double>> constraint_;  // and their a
  std::vector<std::size_t> constraint_column_;   // each constraint's tableau column
  double scale_ = 1.0;                           // the largest |constant|, |b| and slope x total
  // Tableau columns, in the order added: a function's weight (>= 0) or a constraint's multiplier
  // (index into constraint_, with ~ set).
  std::vector<std::size_t> column_of_;
  // Column `what` (a function's index, or ~ a constraint's) in the original rows, its objective
  // coefficient, and the column added to the tableau in the current basis.
  std::vector<double> original_column(std::size_t what) const;
  double objective_of(std::size_t what) const;
  void add_column(std::size_t what);
  std::size_t leaving_row(std::size_t enter, bool bland, double pivot_tolerance,
                          double& ratio) const;
  void pivot_on(std::size_t leave, std::size_t enter);
  void pivot_to_optimum(double scale, std::size_t* pivots_left, double target);
  // The dual's value at the current basis, its weights not normalised.
  double basis_value() const;
  double column_objective(std::size_t column) const;
  // `shares` must be given; `weights` may be null.
  double read_solution(std::vector<double>* shares, std::vector<double>* weights) const;
  bool refactor();
  // The simplex tableau of the dual: one row per (block, coordinate) and one for the weights'
  // sum; columns: the rows' slacks, then each block's bound u_c as u+ and u-, then one weight
  // per function.
  std::vector<std::vector<double>> tableau_;
  std::vector<double> rhs_, reduced_;  // right-hand sides; the objective row (reduced costs)
  std::vector<std::size_t> basis_;
  std::uint64_t pivot_cells_ = 0;
  std::size_t pivot_limit_ = std::numeric_limits<std::size_t>::max();
  bool optimal_ = false;
};

}  // namespace pipetune

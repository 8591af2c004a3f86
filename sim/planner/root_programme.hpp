#pragma once

#include <cstddef>
#include <cstdint>
#include <variant>
#include <vector>

#include "sim/planner/minimax_bound.hpp"
#include "sim/planner/primal_share_programme.hpp"

namespace pipetune {

/// A multi-stage relaxed root's programme in the form that is cheaper for its size. Both solve
/// the same programme to the same optimum; they differ in what a pivot costs. The dual form
/// (MinMaxShareProgramme) has a row per coordinate, the primal form (PrimalShareProgramme) a
/// row per function, so the primal wins where the coordinates (stages x classes) outnumber the
/// functions the rounds add (a busy row per device, then paths).
enum class RootForm { Cheaper, Dual, Primal };

/// Which form every multi-stage root takes from now on, process-wide: the cheaper for its size
/// (the default), or one of them always, so that the tests check the planner's bounds and
/// answers with each form on instances too small to choose the primal one.
void set_root_form(RootForm form);

class RootProgramme {
 public:
  /// `functions_expected`: how many functions the rounds will add at most.
  RootProgramme(std::size_t coordinates, const std::vector<double>& totals,
                std::size_t functions_expected);
  void add(double constant, const std::vector<double>& slope) {
    std::visit([&](auto& p) { p.add(constant, slope); }, form_);
  }
  /// Restricts the shares to  a . x >= b  (after at least one function).
  void add_constraint(const std::vector<double>& a, double b) {
    std::visit([&](auto& p) { p.add_constraint(a, b); }, form_);
  }
  double solve(std::vector<double>* shares, std::vector<double>* weights) {
    return std::visit([&](auto& p) { return p.solve(shares, weights); }, form_);
  }
  double solve_with_least(std::size_t index, double least, std::uint64_t* cells) const {
    return std::visit([&](const auto& p) { return p.solve_with_least(index, least, cells); },
                      form_);
  }
  std::size_t functions() const {
    return std::visit([](const auto& p) { return p.functions(); }, form_);
  }
  double constant(std::size_t i) const {
    return std::visit([&](const auto& p) { return p.constant(i); }, form_);
  }
  const std::vector<double>& slope(std::size_t i) const {
    return std::visit([&](const auto& p) -> const std::vector<double>& { return p.slope(i); },
                      form_);
  }
  std::uint64_t pivot_cells() const {
    return std::visit([](const auto& p) { return p.pivot_cells(); }, form_);
  }

 private:
  std::variant<MinMaxShareProgramme, PrimalShareProgramme> form_;
};

}  // namespace pipetune

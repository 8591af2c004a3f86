#include "sim/planner/root_programme.hpp"

#include <atomic>

#include "sim/planner/tuning.hpp"

namespace pipetune {

namespace {
std::atomic<RootForm> root_form{RootForm::Cheaper};

std::variant<MinMaxShareProgramme, PrimalShareProgramme> form_for(std::size_t coordinates,
                                                                  const std::vector<double>& totals,
                                                                  std::size_t functions_expected) {
  const RootForm form = root_form.load(std::memory_order_relaxed);
  const double width = static_cast<double>(coordinates * totals.size());
  const bool primal =
      form == RootForm::Primal ||
      (form == RootForm::Cheaper &&
       width >= planning::kPrimalRootWidthPerFunction * static_cast<double>(functions_expected));
  if (primal) return PrimalShareProgramme(coordinates, totals);
  return MinMaxShareProgramme(coordinates, totals);
}
}  // namespace

void set_root_form(RootForm form) {
  root_form.store(form, std::memory_order_relaxed);
}

RootProgramme::RootProgramme(std::size_t coordinates, const std::vector<double>& totals,
                             std::size_t functions_expected)
    : form_(form_for(coordinates, totals, functions_expected)) {}

}  // namespace pipetune

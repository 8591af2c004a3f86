#pragma once

// What the CLI prints. Text for people (golden-tested), JSON for programs (docs/cli.md).

#include <string>
#include <vector>

#include "sim/hardware.hpp"
#include "sim/interval.hpp"
#include "sim/planner/planner.hpp"
#include "sim/profile.hpp"
#include "sim/simulator.hpp"
#include "sim/sweep.hpp"
#include "sim/units.hpp"  // format_bandwidth, format_balance: one form for the CLI and the GUI

namespace pipetune::cli {

/// A number rounded to 1e-6 so JSON output stays short and stable across runs.
double tidy(double value);

/// `schedule_csv`: the torch compute-only CSV the schedule came from ("": the plan's own).
/// `interval`: the iteration's interval (sim/interval.hpp), shown where given.
std::string simulation_text(const Profile& profile, const SimulationResult& result,
                            const std::vector<int>& critical_path,
                            const std::string& schedule_csv = {},
                            const IterationInterval* interval = nullptr);
std::string simulation_json(const SimulationResult& result, const std::vector<int>& critical_path,
                            const IterationInterval* interval = nullptr);

/// "80 % of steps in 25.10 - 27.60 ms (9.5 % wide)", or why there is none.
std::string interval_text(const IterationInterval& interval);

std::string sweep_table(const std::vector<SweepRow>& rows);
std::string sweep_csv(const std::vector<SweepRow>& rows);
std::string sweep_json(const std::vector<SweepRow>& rows);

std::string plan_text(const Profile& profile, const Hardware& hardware,
                      const PlanSearchResult& result,
                      const std::vector<IterationInterval>& intervals = {});
/// Why the best plan wins: its bottleneck, bubble, memory headroom, and the best plan of each
/// configuration one choice away (re-planned with those choices).
std::string plan_explanation(const Profile& profile, const Hardware& hardware,
                             const PlannerOptions& options, const PlanSearchResult& result);

/// One line: "compute x0.825 on 2 busy devices, +1.055 ms per task, copies 5.1 GB/s + 0.001 ms".
std::string calibration_summary(const Calibration& calibration);
std::string format_ms(double ms);
std::string format_percent(double fraction);

}  // namespace pipetune::cli

#pragma once

// torch.distributed.pipelining's compute-only schedule CSV (2.11, as
// _PipelineScheduleRuntime._dump_csv writes it and _load_csv reads it): one row per rank, one
// action per cell in the rank's order ("2F0", "0B1", "0I1", "0W1"), empty cells idle. See
// docs/formats.md.

#include <string>
#include <string_view>
#include <vector>

#include "sim/schedule.hpp"

namespace pipetune {

/// Reads a schedule; row r is programme r. Refuses, naming row and cell (both from 1), what
/// torch 2.11 would refuse: an action it cannot parse, a communication action (the file must
/// be compute-only), a stage in two rows, a stage without every micro-batch's forward, a B or I
/// before its F, a W before its I, a micro-batch with no backward or with both B and I+W; and
/// R, which torch has no letter for. Throws InputError.
Schedule parse_schedule_csv(std::string_view text, const std::string& source);
Schedule load_schedule_csv(const std::string& path);

/// One row per device programme, as torch's ranks run them. Recomputes are left out (torch
/// checkpoints inside the stage module); `left_out` counts them.
std::string schedule_csv(const std::vector<std::vector<Action>>& programs, int* left_out = nullptr);

}  // namespace pipetune

#pragma once

// What each rank of a distributed run sends rank 0 after a step (through Transport::gather,
// executor/transport.hpp), and how rank 0 puts the parts together on its own clock. The wire
// format is JSON with named fields, so a part can be read, and a malformed one is refused by
// name.

#include <cstdint>
#include <string>
#include <vector>

#include "sim/trace.hpp"

namespace pipetune::exec {

struct StepRecord;  // executor/executor.hpp

/// One rank's share of a step: what its own device ran and measured.
struct RankPart {
  double origin_ms = 0.0;  ///< rank 0's clock when this rank's step began; times count from it
  double loss = 0.0;       ///< the summed micro-batch losses this rank computed (0 unless last)
  double step_ms = 0.0;
  std::int64_t peak_memory_bytes = 0;
  std::int64_t library_memory_bytes = 0;  ///< StepRecord::library_memory_bytes of the rank's device
  std::vector<TraceTask> tasks;           ///< `step` does not travel: rank 0 knows which step it is
  std::vector<CounterSample> memory;
};

/// This rank's part of `record`: the tasks and memory of device `rank`.
RankPart rank_part(const StepRecord& record, int rank, double origin_ms);

std::string encode_rank_part(const RankPart& part);
/// The part rank `rank` sent. Throws WorkError "rank <r>'s part of the step: <field>: expected
/// …" for a message that is not one.
RankPart decode_rank_part(const std::string& message, int rank);

/// Rank 0's record of step `step` from every rank's part (in rank order), on the clock whose
/// step began at `origin_ms`: losses summed, the longest step, each rank's peak and memory as
/// that rank's device. `with_memory`: keep the memory curves. pipeline_ms is left to the caller,
/// which computes it the same way for one process and for many.
StepRecord merge_rank_parts(const std::vector<RankPart>& parts, int step, double origin_ms,
                            bool with_memory);

}  // namespace pipetune::exec

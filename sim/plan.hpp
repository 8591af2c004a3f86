#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/hardware.hpp"
#include "sim/profile.hpp"

namespace pipetune {

/// torchgpipe's checkpoint modes: micro-batch i of M is recomputed iff i < stop, where stop is
/// M (always), M - 1 (except_last) or 0 (never).
enum class CheckpointMode : std::uint8_t { Always, ExceptLast, Never };

enum class ScheduleKind : std::uint8_t {
  GPipe,     ///< fill-drain: every forward, then every backward in reverse micro-batch order
  OneFOneB,  ///< PipeDream-flush: warm-up forwards, then one backward per forward
  // Several stages per device, as torch.distributed.pipelining 2.11 orders them (schedule.hpp):
  Interleaved1F1B,  ///< ScheduleInterleaved1F1B: stage s on device s mod D, depth first
  InterleavedZB,    ///< ScheduleInterleavedZeroBubble (ZB1P): backward split into I and W
  ZBV,              ///< ScheduleZBVZeroBubble: two stages per device in a V, I and W
  LoopedBFS,        ///< ScheduleLoopedBFS: stage s on device s mod D, breadth first
  DualPipeV         ///< ScheduleDualPipeV: ZBV's V, forward and backward paired, B and I/W
};

std::string_view to_string(CheckpointMode mode);
std::string_view to_string(ScheduleKind kind);
std::optional<CheckpointMode> parse_checkpoint_mode(std::string_view text);
std::optional<ScheduleKind> parse_schedule_kind(std::string_view text);
inline constexpr CheckpointMode kAllCheckpointModes[] = {
    CheckpointMode::Always, CheckpointMode::ExceptLast, CheckpointMode::Never};
inline constexpr ScheduleKind kAllScheduleKinds[] = {
    ScheduleKind::GPipe,         ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
    ScheduleKind::InterleavedZB, ScheduleKind::ZBV,      ScheduleKind::LoopedBFS,
    ScheduleKind::DualPipeV};
/// The schedules that run one stage per programme (GPipe, 1F1B): the ones the planner branches
/// and bounds, and its library default.
inline constexpr ScheduleKind kSingleStageScheduleKinds[] = {ScheduleKind::GPipe,
                                                             ScheduleKind::OneFOneB};

/// The schedules that run several stages per programme.
inline constexpr ScheduleKind kMultiStageScheduleKinds[] = {
    ScheduleKind::Interleaved1F1B, ScheduleKind::LoopedBFS, ScheduleKind::InterleavedZB,
    ScheduleKind::ZBV, ScheduleKind::DualPipeV};

/// True for the schedules whose programmes hold several stages each (`stages_per_device`).
bool is_multi_stage(ScheduleKind kind);
/// True for the schedules that split the backward into I and W (zero bubble; DualPipeV splits
/// some micro-batches' and runs the others' whole).
bool splits_backward(ScheduleKind kind);
/// The one stages-per-device count a schedule runs (2 for the V schedules, zbv and dualpipev),
/// or nothing where any count goes (the looped ones; 1 for GPipe and 1F1B).
std::optional<int> fixed_stages_per_device(ScheduleKind kind);
/// The programme (torch's rank) that runs `stage` of `stages` under `kind` with
/// `stages_per_device` stages each: s mod D for the looped schedules, a V for ZBV and DualPipeV
/// (device r holds stages r and 2D - 1 - r), s itself for GPipe and 1F1B.
int stage_rank(ScheduleKind kind, int stage, int stages, int stages_per_device);

/// How a model is pipelined (format pipetune.plan/1).
struct Plan {
  std::vector<int> balance;  ///< layers per stage
  int chunks = 1;            ///< micro-batches requested (tensor.chunk may make fewer)
  CheckpointMode checkpoint = CheckpointMode::ExceptLast;
  ScheduleKind schedule = ScheduleKind::GPipe;
  std::vector<std::string> devices;  ///< stage -> device name; empty: stage i on device i
  double optimizer_state_factor = 0.0;
  /// Stages each device runs (multi-stage schedules; 1 for GPipe and 1F1B). The balance has
  /// stages_per_device × devices stages.
  int stages_per_device = 1;

  int stages() const { return static_cast<int>(balance.size()); }
  bool operator==(const Plan&) const = default;
};

inline constexpr std::string_view kPlanFormat = "pipetune.plan/1";

Plan parse_plan(std::string_view text, const std::string& source);
Plan load_plan(const std::string& path);
std::string plan_to_json(const Plan& plan);
void save_plan(const Plan& plan, const std::string& path);
/// The same, and for the reader, where the plan puts each of the profile's tied tensors
/// (`"tied_parameters": [{"name": …, "stages": […]}]`); parse_plan reads past it (the executor
/// finds ties in the model itself).
std::string plan_to_json(const Plan& plan, const Profile& profile);
void save_plan(const Plan& plan, const Profile& profile, const std::string& path);

/// One line for tables and logs: "[3,3,2] x8 except_last gpipe".
std::string describe_plan(const Plan& plan);

/// Rejects a plan that does not fit the profile or the hardware, naming `source` and the field:
/// balance not summing to the layer count, chunks above the batch size, unknown device names,
/// more stages than devices without a `devices` mapping, stages per device that the schedule
/// cannot run, a `devices` mapping that splits one programme over two devices.
void check_plan(const Plan& plan, const Profile& profile, const Hardware& hardware,
                const std::string& source);

/// The most chunks a plan over a batch of `batch` samples may ask for: the batch size, and at
/// most limits::kMaxChunks.
int max_chunks(std::int64_t batch);
/// "expected 1 to N (the batch size)" or "(… at most 4096)": the reason for max_chunks.
std::string chunks_expectation(std::int64_t batch);

/// Device index of each stage (the plan must have passed check_plan): `devices` when named,
/// else the stage's programme (stage_rank).
std::vector<int> stage_devices(const Plan& plan, const Hardware& hardware);

/// True iff micro-batch `micro_batch` of `micro_batches` is checkpointed (recomputed).
bool is_checkpointed(CheckpointMode mode, int micro_batch, int micro_batches);

/// The sizes tensor.chunk(chunks) gives a batch: ceil(batch / chunks) each, the last one smaller.
/// There may be fewer than `chunks` of them (10 split into 4 gives 3,3,3,1; into 6 gives
/// 2,2,2,2,2).
std::vector<std::int64_t> split_batch(std::int64_t batch, int chunks);

/// How many micro-batches split_batch makes: the schedules' micro-batch count, which may be
/// below `chunks`.
int micro_batch_count(std::int64_t batch, int chunks);

/// Whether `chunks` splits the profile's batch into micro-batches of at least its
/// min_micro_batch samples (the last, smallest, included).
bool splits_trainably(const Profile& profile, int chunks);

}  // namespace pipetune

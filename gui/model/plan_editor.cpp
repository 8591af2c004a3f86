#include "gui/model/plan_editor.hpp"

#include <QElapsedTimer>
#include <algorithm>

#include "sim/balance.hpp"
#include "sim/error.hpp"

namespace pipetune::gui {

PlanEditor::PlanEditor(QObject* parent) : QObject(parent) {}

PlanEditor::~PlanEditor() {
  simulator_.reset();  // before what it refers to
}

void PlanEditor::open_profile(Profile profile, std::optional<Hardware> hardware) {
  simulator_.reset();
  profile_ = std::make_unique<Profile>(std::move(profile));
  const int layers = static_cast<int>(profile_->layer_count());
  hardware_from_file_ = hardware.has_value();
  base_hardware_ =
      hardware ? std::move(*hardware) : replicate_device(profile_->device, std::min(4, layers));
  edits_ = {};
  if (static_cast<int>(base_hardware_.devices.size()) > layers) edits_.device_count = layers;
  rebuild_hardware();

  const int stages = static_cast<int>(hardware_->devices.size());
  Plan plan;
  plan.chunks = static_cast<int>(std::min<std::int64_t>(profile_->batch_size, 4 * stages));
  plan.balance = balanced(stages, plan);
  plan_ = plan;
  emit profile_changed();
  emit hardware_changed();
  emit plan_changed();
  simulate();
}

void PlanEditor::open_hardware(Hardware hardware) {
  if (!profile_) return;
  base_hardware_ = std::move(hardware);
  hardware_from_file_ = true;
  edits_ = {};
  const int layers = static_cast<int>(profile_->layer_count());
  // Every stage needs a layer: stages_per_device stages on each device.
  const int most_devices = layers / plan_.stages_per_device;
  if (static_cast<int>(base_hardware_.devices.size()) > most_devices) {
    edits_.device_count = most_devices;
  }
  rebuild_hardware();
  emit hardware_changed();
  try {
    check_plan(plan_, *profile_, *hardware_, "plan");
  } catch (const InputError&) {
    const int devices = static_cast<int>(hardware_->devices.size());
    plan_.devices.clear();
    plan_.balance = balanced(devices * plan_.stages_per_device, plan_);
    try {
      check_plan(plan_, *profile_, *hardware_, "plan");
    } catch (const InputError&) {
      // The multi-stage schedule is refused on these devices: fall back to one stage each.
      plan_.schedule = ScheduleKind::GPipe;
      plan_.stages_per_device = 1;
      plan_.balance = balanced(devices, plan_);
    }
  }
  emit plan_changed();
  simulate();
}

void PlanEditor::rebuild_hardware() {
  simulator_.reset();
  hardware_ = std::make_unique<Hardware>(apply_edits(base_hardware_, edits_));
  simulator_ = std::make_unique<Simulator>(*profile_, *hardware_);
  ++simulators_built_;
}

std::vector<int> PlanEditor::balanced(int stages, const Plan& shape) const {
  Plan one_per_device = shape;
  one_per_device.devices.clear();
  one_per_device.balance.assign(stages, 1);
  return time_balanced(simulator_->costs(), *hardware_, stages, one_per_device);
}

QString PlanEditor::commit(Plan plan) {
  if (!profile_) return QStringLiteral("open a profile first");
  // Without a stage-to-device map, every stage needs its own device: grow the devices to the
  // stages (or, for made-up devices, shrink them too).
  // A multi-stage plan needs one device per programme (stages_per_device stages each).
  if (plan.devices.empty() && plan.stages_per_device >= 1) {
    const int devices = static_cast<int>(hardware_->devices.size());
    const int programmes = plan.stages() / plan.stages_per_device;
    if (programmes > devices || (!hardware_from_file_ && programmes < devices)) {
      if (programmes < 1) return QStringLiteral("a plan needs at least one stage");
      const HardwareEdits before = edits_;
      edits_.device_count = programmes;
      rebuild_hardware();
      try {
        check_plan(plan, *profile_, *hardware_, "plan");
      } catch (const InputError& e) {
        edits_ = before;
        rebuild_hardware();
        return QString::fromStdString(e.what());
      }
      emit hardware_changed();
    }
  }
  try {
    check_plan(plan, *profile_, *hardware_, "plan");
  } catch (const InputError& e) {
    return QString::fromStdString(e.what());
  }
  plan_ = std::move(plan);
  emit plan_changed();
  simulate();
  return {};
}

QString PlanEditor::apply_plan(const Plan& plan) {
  return commit(plan);
}

QString PlanEditor::set_balance(const std::vector<int>& balance) {
  Plan plan = plan_;
  if (balance.size() != plan.balance.size()) plan.devices.clear();
  plan.balance = balance;
  return commit(std::move(plan));
}

void PlanEditor::move_boundary(int boundary, int gap) {
  if (!profile_ || boundary < 0 || boundary + 1 >= plan_.stages()) return;
  int first = 0;
  for (int s = 0; s < boundary; ++s) first += plan_.balance[s];
  const int end = first + plan_.balance[boundary] + plan_.balance[boundary + 1];
  const int clamped = std::clamp(gap, first + 1, end - 1);
  if (clamped - first == plan_.balance[boundary]) return;  // nothing moved: no re-simulation
  Plan plan = plan_;
  plan.balance[boundary] = clamped - first;
  plan.balance[boundary + 1] = end - clamped;
  commit(std::move(plan));
}

QString PlanEditor::set_chunks(int chunks) {
  if (!profile_ || chunks == plan_.chunks) return {};
  Plan plan = plan_;
  plan.chunks = std::clamp(chunks, 1, max_chunks(profile_->batch_size));  // check_plan's bound
  return commit(std::move(plan));
}

void PlanEditor::set_checkpoint(CheckpointMode mode) {
  if (!profile_ || mode == plan_.checkpoint) return;
  Plan plan = plan_;
  plan.checkpoint = mode;
  commit(std::move(plan));
}

QString PlanEditor::set_schedule(ScheduleKind kind) {
  if (!profile_ || kind == plan_.schedule) return {};
  Plan plan = plan_;
  plan.schedule = kind;
  if (const auto fixed = fixed_stages_per_device(kind)) {
    plan.stages_per_device = *fixed;
  } else if (!is_multi_stage(plan_.schedule)) {
    plan.stages_per_device = 2;  // the least that interleaves
  }
  return restage(std::move(plan), programmes());
}

QString PlanEditor::set_stages_per_device(int stages_per_device) {
  if (!profile_ || stages_per_device == plan_.stages_per_device) return {};
  Plan plan = plan_;
  plan.stages_per_device = stages_per_device;
  return restage(std::move(plan), programmes());
}

int PlanEditor::programmes() const {
  return plan_.stages() / std::max(1, plan_.stages_per_device);
}

QString PlanEditor::restage(Plan plan, int devices) {
  const int v = plan.stages_per_device;
  if (v < 1) {
    return QStringLiteral("stages per device: expected a positive integer, got %1").arg(v);
  }
  // A count the schedule cannot run at all is check_plan's to name (commit below).
  const auto fixed = fixed_stages_per_device(plan.schedule);
  const bool accepted = !fixed || v == *fixed;
  const int stages = v * devices;
  const int layers = static_cast<int>(profile_->layer_count());
  if (accepted && stages > layers) {
    return QStringLiteral(
               "%1 with %2 stages per device on %3 device%4 needs %5 stages, but the profile has "
               "only %6 layers (one per stage at least)")
        .arg(QString::fromUtf8(to_string(plan.schedule).data()))
        .arg(v)
        .arg(devices)
        .arg(devices == 1 ? "" : "s")
        .arg(stages)
        .arg(layers);
  }
  if (!accepted) return commit(std::move(plan));
  if (stages != plan_.stages()) {
    plan.devices.clear();
    plan.balance = balanced(stages, plan);
  }
  return commit(std::move(plan));
}

void PlanEditor::set_optimizer_state_factor(double factor) {
  if (!profile_ || factor == plan_.optimizer_state_factor || factor < 0) return;
  Plan plan = plan_;
  plan.optimizer_state_factor = factor;
  commit(std::move(plan));
}

QString PlanEditor::even_out() {
  if (!profile_) return QStringLiteral("open a profile first");
  Plan plan = plan_;
  plan.balance = time_balanced(simulator_->costs(), *hardware_, plan.stages(), plan);
  if (plan.balance.empty()) return QStringLiteral("fewer layers than stages");
  if (plan.balance == plan_.balance) return {};
  return commit(std::move(plan));
}

QString PlanEditor::set_device_count(int count) {
  if (!profile_) return QStringLiteral("open a profile first");
  const int v = plan_.stages_per_device;
  const int most = static_cast<int>(profile_->layer_count()) / v;
  if (count < 1 || count > most) {
    if (v == 1) {
      return QStringLiteral("expected 1 to %1 devices (one layer per stage at least), got %2")
          .arg(most)
          .arg(count);
    }
    return QStringLiteral(
               "expected 1 to %1 devices (%2 stages per device, one layer per stage at least), "
               "got %3")
        .arg(most)
        .arg(v)
        .arg(count);
  }
  if (count == static_cast<int>(hardware_->devices.size()) && plan_.devices.empty() &&
      plan_.stages() == count * v) {
    return {};
  }
  const HardwareEdits before = edits_;
  edits_.device_count = count;
  rebuild_hardware();
  emit hardware_changed();
  Plan plan = plan_;
  plan.devices.clear();
  plan.balance = balanced(count * v, plan);
  QString problem = commit(std::move(plan));
  if (!problem.isEmpty()) {  // e.g. torch refuses the schedule on `count` devices
    edits_ = before;
    rebuild_hardware();
    emit hardware_changed();
  }
  return problem;
}

void PlanEditor::set_memory_per_device(std::int64_t bytes) {
  if (!profile_ || bytes < 0 || bytes == memory_per_device()) return;
  edits_.memory_bytes = bytes;
  rebuild_hardware();
  emit hardware_changed();
  simulate();
}

void PlanEditor::set_link_bandwidth(double bytes_per_s) {
  if (!profile_ || !(bytes_per_s > 0)) return;
  if (bytes_per_s == hardware_->link.bandwidth_bytes_per_s && hardware_->links.empty()) return;
  edits_.bandwidth_bytes_per_s = bytes_per_s;
  rebuild_hardware();
  emit hardware_changed();
  simulate();
}

std::int64_t PlanEditor::memory_per_device() const {
  if (!hardware_ || hardware_->devices.empty()) return 0;
  const std::int64_t first = hardware_->devices.front().memory_bytes;
  for (const auto& d : hardware_->devices) {
    if (d.memory_bytes != first) return -1;
  }
  return first;
}

std::vector<double> PlanEditor::layer_ms() const {
  if (!profile_) return {};
  const std::int64_t size = split_batch(profile_->batch_size, plan_.chunks).front();
  const SizeCosts& costs = simulator_->costs().at(size);
  std::vector<double> out(costs.forward_ms.size());
  for (std::size_t l = 0; l < out.size(); ++l) out[l] = costs.forward_ms[l] + costs.backward_ms[l];
  return out;
}

std::vector<double> PlanEditor::stage_ms() const {
  if (!profile_ || !profile_->has_launch_times()) return {};
  const std::int64_t size = split_batch(profile_->batch_size, plan_.chunks).front();
  const SizeCosts& costs = simulator_->costs().at(size);
  std::vector<double> out;
  int first = 0;
  for (const int layers : plan_.balance) {
    out.push_back(costs.forward_task_ms(first, first + layers, 1.0) +
                  costs.backward_task_ms(first, first + layers, 1.0));
    first += layers;
  }
  return out;
}

void PlanEditor::simulate() {
  QElapsedTimer timer;
  timer.start();
  SimulationOptions options;
  options.record_tasks = true;
  options.record_memory = true;
  // One max-flow per device: about 9 ms at 8 stages x 64 micro-batches, 100 at 16 x 128
  // (docs/benchmarks.md). Above that an edit would miss its frame, so larger plans go without.
  constexpr int kWorstOrderLargestCells = 512;
  options.worst_order_peaks = plan_.stages() * plan_.chunks <= kWorstOrderLargestCells;
  result_ = simulator_->run(plan_, options);
  // Its ends: two more runs without records, where the profile has spreads.
  interval_ = interval_around(*simulator_, *profile_, plan_, result_.iteration_ms);
  last_wall_ms_ = static_cast<double>(timer.nsecsElapsed()) / 1e6;
  emit simulated();
}

}  // namespace pipetune::gui

#include "sim/stage_timing.hpp"

#include <algorithm>

#include "sim/schedule.hpp"

namespace pipetune {

StageDurations stage_durations(const SizeCosts& common, const SizeCosts& last, int first, int end,
                               double speed, double overhead_ms, const Link* next_link,
                               const Link* previous_link) {
  StageDurations d;
  for (int slot = 0; slot < 2; ++slot) {
    const SizeCosts& c = slot == 0 ? common : last;
    // The same expressions as Simulator::run, so that the results agree bit for bit.
    d.forward[slot] = c.forward_ms_sum(first, end) / speed + overhead_ms;
    d.forward_nograd[slot] = c.forward_nograd_ms_sum(first, end) / speed + overhead_ms;
    d.backward[slot] = c.backward_ms_sum(first, end) / speed + overhead_ms;
    if (next_link)
      d.activation_copy[slot] =
          next_link->transfer_ms(static_cast<double>(c.output_bytes[end - 1]));
    if (previous_link) {
      d.gradient_copy[slot] =
          previous_link->transfer_ms(static_cast<double>(c.stage_input_bytes(first)));
    }
  }
  return d;
}

IterationSweep::IterationSweep(ScheduleKind schedule, CheckpointMode checkpoint, int stages,
                               int micro_batches, bool last_differs)
    : stages_(stages), micro_batches_(micro_batches) {
  const Schedule s = make_schedule(schedule, stages, micro_batches, checkpoint);
  for (const Action& a : program_order(s)) {
    Step step{};
    step.kind = a.kind == ActionKind::Forward ? 0 : a.kind == ActionKind::Recompute ? 1 : 2;
    step.slot = last_differs && a.micro_batch == micro_batches - 1 ? 1 : 0;
    step.nograd = a.kind == ActionKind::Forward && s.recomputes(a.micro_batch) ? 1 : 0;
    step.stage = a.stage;
    step.micro_batch = a.micro_batch;
    order_.push_back(step);
    // A forward sends its activation on, a backward its gradient back.
    if ((step.kind == 0 && a.stage + 1 < stages) || (step.kind == 2 && a.stage > 0)) ++task_count_;
  }
  task_count_ += order_.size();
  prefix_order_.resize(stages);
  for (int last = 0; last + 1 < stages; ++last) {
    for (const Step& step : order_) {
      if (step.stage <= last) prefix_order_[last].push_back(step);
    }
  }
  const std::size_t cells = static_cast<std::size_t>(stages) * micro_batches;
  activation_at_.assign(cells, 0.0);
  gradient_at_.assign(cells, 0.0);
  stage_free_.assign(stages, 0.0);
  activation_channel_free_.assign(stages, 0.0);
  gradient_channel_free_.assign(stages, 0.0);
}

double IterationSweep::run(std::span<const StageDurations> stages) const {
  return sweep(order_, stages, stages_ - 1, 0.0, 0.0);
}

double IterationSweep::run_prefix(std::span<const StageDurations> stages, int last,
                                  double trip_full, double trip_last) const {
  return sweep(last + 1 == stages_ ? order_ : prefix_order_[last], stages, last, trip_full,
               trip_last);
}

double IterationSweep::sweep(const std::vector<Step>& order, std::span<const StageDurations> stages,
                             int last_stage, double trip_full, double trip_last) const {
  std::fill(stage_free_.begin(), stage_free_.end(), 0.0);
  std::fill(activation_channel_free_.begin(), activation_channel_free_.end(), 0.0);
  std::fill(gradient_channel_free_.begin(), gradient_channel_free_.end(), 0.0);
  const int m = micro_batches_;
  const std::array<double, 2> trip{trip_full, trip_last};
  double makespan = 0.0;
  for (const Step& step : order) {
    const int s = step.stage, i = step.micro_batch;
    const StageDurations& d = stages[s];
    double& free = stage_free_[s];
    const std::size_t cell = static_cast<std::size_t>(s) * m + i;
    switch (step.kind) {
      case 0: {  // forward: needs the previous stage's activation
        const double start = s > 0 ? std::max(free, activation_at_[cell]) : free;
        free = start + (step.nograd ? d.forward_nograd[step.slot] : d.forward[step.slot]);
        if (s < last_stage) {
          // Copies leave in the order the forwards run, which is this order.
          double& channel = activation_channel_free_[s];
          const double copy_start = std::max(free, channel);
          channel = copy_start + d.activation_copy[step.slot];
          activation_at_[cell + m] = channel;
          makespan = std::max(makespan, channel);
        } else if (s + 1 < stages_) {
          // The round trip through the stages left out, as early as it can be back.
          gradient_at_[cell] = free + trip[i == m - 1 ? 1 : 0];
        }
        break;
      }
      case 1:  // recompute: its forward ran earlier on this stream
        free += d.forward[step.slot];
        break;
      default: {  // backward: needs the next stage's gradient
        const double start = s < stages_ - 1 ? std::max(free, gradient_at_[cell]) : free;
        free = start + d.backward[step.slot];
        if (s > 0) {
          double& channel = gradient_channel_free_[s];
          const double copy_start = std::max(free, channel);
          channel = copy_start + d.gradient_copy[step.slot];
          gradient_at_[cell - m] = channel;
          makespan = std::max(makespan, channel);
        }
        break;
      }
    }
    makespan = std::max(makespan, free);
  }
  return makespan;
}

}  // namespace pipetune

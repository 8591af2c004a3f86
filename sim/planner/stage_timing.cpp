#include "sim/planner/stage_timing.hpp"

#include <algorithm>

#include "sim/schedule.hpp"

namespace pipetune {

StageDurations stage_durations(const SizeCosts& common, const SizeCosts& last, int first, int end,
                               double speed, double overhead_ms, const Link* next_link,
                               const Link* previous_link, bool with_launches) {
  StageDurations d;
  for (int slot = 0; slot < 2; ++slot) {
    const SizeCosts& c = slot == 0 ? common : last;
    // The same expressions as Simulator::run, so that the results agree bit for bit.
    d.forward[slot] = c.forward_ms_sum(first, end) / speed + overhead_ms;
    d.forward_nograd[slot] = c.forward_nograd_ms_sum(first, end) / speed + overhead_ms;
    d.backward[slot] = c.backward_ms_sum(first, end) / speed + overhead_ms;
    if (with_launches && c.launch_times) {
      d.launch_paced = true;
      d.forward_launch[slot] = c.forward_launch_ms(first, end) + overhead_ms;
      d.forward_nograd_launch[slot] = c.forward_nograd_launch_ms(first, end) + overhead_ms;
      d.backward_launch[slot] = c.backward_launch_ms(first, end) + overhead_ms;
    }
    if (next_link) {
      d.activation_copy[slot] =
          next_link->transfer_ms(static_cast<double>(c.output_bytes[end - 1]));
      d.output_gradient_copy[slot] =
          next_link->transfer_ms(static_cast<double>(c.stage_input_gradient_bytes(end)));
    }
    if (previous_link) {
      d.gradient_copy[slot] =
          previous_link->transfer_ms(static_cast<double>(c.stage_input_gradient_bytes(first)));
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
  activation_launched_.assign(cells, 0.0);
  gradient_launched_.assign(cells, 0.0);
  host_free_.assign(stages, 0.0);
  activation_channel_free_.assign(stages, 0.0);
  gradient_channel_free_.assign(stages, 0.0);
}

// The sweep's bookkeeping of which task or copy set each time, for run_critical_path(); the
// plain sweep compiles it away.
struct IterationSweep::NoTracker {
  void stage(int, int, int) {}
  void copy(int, int, int, int, bool) {}
  void arrive_from(int, int) {}
  void end(int) {}
};

// Every time the sweep keeps (a stage's stream free, a channel free, an input arrived) comes
// with the event that set it; each event records the one it waited for.
struct IterationSweep::PathTracker {
  struct Event {
    int previous;  // -1: the path starts here
    int stage;     // or the link, for a copy
    int index;     // into PathCounts::tasks or copies
    bool copy;
  };
  std::vector<Event> events;
  std::vector<int> stage_last, activation_channel_last, gradient_channel_last;
  std::vector<int> activation_from, gradient_from;  // [stage * M + i]: the copy that brought it
  int pending_wait = -1;  // the input the next task waited for, when it did
  int final_event = -1;
  // Kept between sweeps (the planner's cutting planes run one per prefix they bound, and
  // growing these afresh was a fifth of each). A cell's copy is recorded before the task that
  // reads it, so activation_from and gradient_from need no clearing.
  void reset(int stages, int micro_batches, std::size_t event_count) {
    events.clear();
    events.reserve(event_count);
    stage_last.assign(stages, -1);
    activation_channel_last.assign(stages, -1);
    gradient_channel_last.assign(stages, -1);
    activation_from.resize(static_cast<std::size_t>(stages) * micro_batches, -1);
    gradient_from.resize(static_cast<std::size_t>(stages) * micro_batches, -1);
    pending_wait = -1;
    final_event = -1;
  }
  // A compute task on stage s: it follows the input it waited for, or the stage's last task.
  void stage(int s, int kind, int slot) {
    const int previous = pending_wait >= 0 ? pending_wait : stage_last[s];
    pending_wait = -1;
    events.push_back({previous, s, kind * 2 + slot, false});
    stage_last[s] = static_cast<int>(events.size()) - 1;
  }
  // A copy over the link after stage `link`: it follows the task just recorded, or the copy
  // before it on its channel when it had to wait for the channel.
  void copy(int link, int direction, int slot, int cell, bool waited_for_channel) {
    std::vector<int>& channel = direction == 0 ? activation_channel_last : gradient_channel_last;
    const int previous = waited_for_channel ? channel[link] : static_cast<int>(events.size()) - 1;
    events.push_back({previous, link, direction * 2 + slot, true});
    channel[link] = static_cast<int>(events.size()) - 1;
    (direction == 0 ? activation_from : gradient_from)[cell] = channel[link];
  }
  // The next task waits for its input rather than for its stage.
  void arrive_from(int cell, int direction) {
    pending_wait = (direction == 0 ? activation_from : gradient_from)[cell];
  }
  void end(int event) { final_event = event; }
};

namespace {
bool launch_paced(std::span<const StageDurations> stages, int last) {
  for (int s = 0; s <= last; ++s) {
    if (stages[s].launch_paced) return true;
  }
  return false;
}
}  // namespace

IterationSweep::~IterationSweep() = default;
IterationSweep::IterationSweep(IterationSweep&&) noexcept = default;
IterationSweep& IterationSweep::operator=(IterationSweep&&) noexcept = default;

double IterationSweep::run(std::span<const StageDurations> stages) const {
  NoTracker none;
  return launch_paced(stages, stages_ - 1)
             ? sweep<NoTracker, true>(order_, stages, stages_ - 1, 0.0, 0.0, nullptr, none)
             : sweep<NoTracker, false>(order_, stages, stages_ - 1, 0.0, 0.0, nullptr, none);
}

double IterationSweep::run_prefix(std::span<const StageDurations> stages, int last,
                                  double trip_full, double trip_last,
                                  const DownstreamPacing* pacing) const {
  NoTracker none;
  const std::vector<Step>& order = last + 1 == stages_ ? order_ : prefix_order_[last];
  return launch_paced(stages, last)
             ? sweep<NoTracker, true>(order, stages, last, trip_full, trip_last, pacing, none)
             : sweep<NoTracker, false>(order, stages, last, trip_full, trip_last, pacing, none);
}

double IterationSweep::run_critical_path(std::span<const StageDurations> stages,
                                         PathCounts& path) const {
  if (!path_tracker_) path_tracker_ = std::make_unique<PathTracker>();
  PathTracker& tracker = *path_tracker_;
  tracker.reset(stages_, micro_batches_, task_count_);
  const double makespan =
      sweep<PathTracker, false>(order_, stages, stages_ - 1, 0.0, 0.0, nullptr, tracker);
  path.tasks.assign(stages_, {});
  path.copies.assign(stages_, {});
  for (int e = tracker.final_event; e >= 0; e = tracker.events[e].previous) {
    const auto& event = tracker.events[e];
    (event.copy ? path.copies[event.stage][event.index] : path.tasks[event.stage][event.index]) +=
        1;
  }
  return makespan;
}

// Every clock of a sweep at 0, and the pacing chains where `pacing` has them.
template <bool kLaunchPaced>
void IterationSweep::reset_clocks(const DownstreamPacing* pacing) const {
  if (pacing) steady_chain_.assign(pacing->steady.size(), 0.0);
  std::fill(stage_free_.begin(), stage_free_.end(), 0.0);
  std::fill(activation_channel_free_.begin(), activation_channel_free_.end(), 0.0);
  std::fill(gradient_channel_free_.begin(), gradient_channel_free_.end(), 0.0);
  if constexpr (kLaunchPaced) {
    std::fill(host_free_.begin(), host_free_.end(), 0.0);
    // The stages left out of a prefix send gradients launched at 0 at the earliest.
    std::fill(gradient_launched_.begin(), gradient_launched_.end(), 0.0);
  }
}

// The device's run of a task of `duration` on stage s that may start at `ready`, launched from
// `launched` on (the host's clock is advanced by `launch`); returns its end.
template <bool kLaunchPaced>
double IterationSweep::run_on_stage(int s, double ready, double launched, double duration,
                                    double launch) const {
  double& free = stage_free_[s];
  if constexpr (kLaunchPaced) {
    double& host = host_free_[s];
    const double launch_start = std::max(host, launched);
    host = launch_start + launch;
    const double start = std::max(std::max(free, ready), launch_start);
    free = std::max(start + duration, host);
  } else {
    free = std::max(free, ready) + duration;
  }
  return free;
}

// When the gradient of `step`'s micro-batch is back at the prefix's last stage at the earliest,
// its own round trip back at `own`, with the chains of DownstreamPacing (the last stage's, one
// per group): each a lower bound on when its pacing stage ended a micro-batch's backward plus
// the fixed way back here from it, kept a hair below the sums, which the simulator adds task by
// task in another order.
double IterationSweep::paced_way_back(const Step& step, double own, const DownstreamPacing& pacing,
                                      LastChain& last) const {
  constexpr double kBelow = 1.0 - 1e-12;
  const double work =
      step.nograd ? pacing.last_work_recomputed[step.slot] : pacing.last_work[step.slot];
  const bool carried = last.slot == step.slot;
  last.time = carried ? std::max(own, (last.time + work) * kBelow) : own;
  last.slot = step.slot;
  double back = last.time;
  // Groups from the smallest: each one's busiest stage is at or before the busiest of the group
  // it contains, so its gradients are back no earlier than theirs.
  for (std::size_t k = 0; k < pacing.steady.size(); ++k) {
    const SteadyPace& pace = pacing.steady[k];
    double& chain = steady_chain_[k];
    chain = std::max(
        carried ? (chain + (step.micro_batch <= pace.until ? pace.work : 0.0)) * kBelow : own,
        back);
    back = chain;
  }
  return back;
}

// With launch pacing (see run()), per stage: h0 = max(host free, input launched), the host
// free again at h1 = h0 + launch; the device starts at max(stream free, input there, h0) and
// ends at max(start + duration, h1), as the simulator's two passes compute it. A copy is
// launched when its producer's launch ends (a copy thread only enqueues it).
template <typename Tracker, bool kLaunchPaced>
double IterationSweep::sweep(const std::vector<Step>& order, std::span<const StageDurations> stages,
                             int last_stage, double trip_full, double trip_last,
                             const DownstreamPacing* pacing, Tracker& tracker) const {
  reset_clocks<kLaunchPaced>(pacing);
  const int m = micro_batches_;
  const std::array<double, 2> trip{trip_full, trip_last};
  LastChain last_chain;
  double makespan = 0.0;
  // Events are numbered as the tracker records them: one per task and per copy.
  int event = -1, makespan_event = -1;
  auto ends = [&](double time) {
    ++event;
    if (time > makespan) {
      makespan = time;
      makespan_event = event;
    }
  };
  for (const Step& step : order) {
    const int s = step.stage, i = step.micro_batch;
    const StageDurations& d = stages[s];
    const std::size_t cell = static_cast<std::size_t>(s) * m + i;
    switch (step.kind) {
      case 0: {  // forward: needs the previous stage's activation
        const double ready = s > 0 ? activation_at_[cell] : 0.0;
        if (s > 0 && ready > stage_free_[s]) tracker.arrive_from(static_cast<int>(cell), 0);
        const double end = run_on_stage<kLaunchPaced>(
            s, ready, s > 0 ? activation_launched_[cell] : 0.0,
            step.nograd ? d.forward_nograd[step.slot] : d.forward[step.slot],
            step.nograd ? d.forward_nograd_launch[step.slot] : d.forward_launch[step.slot]);
        tracker.stage(s, step.nograd ? 1 : 0, step.slot);
        ends(end);
        if (s < last_stage) {
          // Copies leave in the order the forwards run, which is this order.
          double& channel = activation_channel_free_[s];
          const bool waits = channel > end;
          const double copy_start = std::max(end, channel);
          channel = copy_start + d.activation_copy[step.slot];
          activation_at_[cell + m] = channel;
          if constexpr (kLaunchPaced) activation_launched_[cell + m] = host_free_[s];
          tracker.copy(s, 0, step.slot, static_cast<int>(cell + m), waits);
          ends(channel);
        } else if (s + 1 < stages_) {
          // The round trip through the stages left out, as early as it can be back.
          const double own = end + trip[i == m - 1 ? 1 : 0];
          gradient_at_[cell] = pacing ? paced_way_back(step, own, *pacing, last_chain) : own;
        }
        break;
      }
      case 1:  // recompute: its forward ran earlier on this stream
        ends(run_on_stage<kLaunchPaced>(s, 0.0, 0.0, d.forward[step.slot],
                                        d.forward_launch[step.slot]));
        tracker.stage(s, 2, step.slot);
        break;
      default: {  // backward: needs the next stage's gradient
        const bool waits_for_gradient = s < stages_ - 1;
        const double ready = waits_for_gradient ? gradient_at_[cell] : 0.0;
        if (waits_for_gradient && ready > stage_free_[s])
          tracker.arrive_from(static_cast<int>(cell), 1);
        const double end = run_on_stage<kLaunchPaced>(
            s, ready, waits_for_gradient ? gradient_launched_[cell] : 0.0, d.backward[step.slot],
            d.backward_launch[step.slot]);
        tracker.stage(s, 3, step.slot);
        ends(end);
        if (s > 0) {
          double& channel = gradient_channel_free_[s];
          const bool waits = channel > end;
          const double copy_start = std::max(end, channel);
          channel = copy_start + d.gradient_copy[step.slot];
          gradient_at_[cell - m] = channel;
          if constexpr (kLaunchPaced) gradient_launched_[cell - m] = host_free_[s];
          tracker.copy(s - 1, 1, step.slot, static_cast<int>(cell - m), waits);
          ends(channel);
        }
        break;
      }
    }
  }
  tracker.end(makespan_event);
  return makespan;
}

}  // namespace pipetune

#pragma once

// The discrete-event engine under the simulator: small on purpose.
//
// A resource (a device's compute stream, one direction of a link) runs its tasks one at a time,
// in the order they were added to it. A task starts once the task before it on its resource and
// all its dependencies have finished, and holds the resource for its duration. Events are task
// completions, processed in time order. Within one instant: every completion's frees first, then
// zero-duration tasks (copies over an ideal link) start and finish, then the tasks that take time
// start and allocate. So memory released "at" an instant is free for what starts then.
//
// Counters (one per device) follow memory: a task may add bytes to one counter when it starts,
// subtract bytes from it at up to two points inside the task (the mid and late effects: where its
// transient peak is over, and where it steps down again), and
// subtract bytes from one counter when it ends. The engine keeps each counter's current value,
// its peak, and, when asked, its history.
//
// A task may also be paced by something outside the graph (a GPU stream by the host thread that
// launches its kernels): it starts no earlier than its release time and ends no earlier than its
// finish floor, whatever its duration (set_pacing). The resource idles until the release.
//
// A task may also hold a lock while it runs (set_lock): one thread that tasks of several
// resources take turns on (autograd runs every backward of one GPU on one thread, whichever
// stream it is for). A task whose lock is held waits, its resource idle; waiters get the lock
// in the order they became ready to start.
//
// The graph (tasks, resources, dependencies) is built once; durations, memory effects and
// counters' initial values may change between runs, so one graph serves many plans of the same
// shape.
//
// Two ways to run, one answer. Without locks every order is fixed by the graph, so a task starts
// at the latest end of its edges: run() times every task in one pass in topological order, then
// replays each counter's changes by merging its resources' runs of changes, each already in time
// order (a resource runs one task at a time). Within an instant only the phases above matter
// while each phase only frees or only allocates: the instant's highest value is then where its
// starts' allocations end. Where a phase could mix them (a lock, which hands out turns by
// arrival; a task without time that allocates; an allocation at a mid effect or an end, as
// posted receives and torch's kept outputs make; a free at a start; a time lost to rounding),
// run() processes events as above instead. Both give the same results bit for bit (tested on
// random graphs and on every kind of prediction); a prediction at 16 x 128 runs 1.6-1.7x as fast.

#include <cstdint>
#include <utility>
#include <vector>

namespace pipetune {

namespace detail {
// A pending event as one integer: the time, mapped to an order-preserving unsigned integer, in
// the high 64 bits and the task's key, biased to unsigned, in the low 32, so that one integer
// comparison orders events by (time, key).
__extension__ using CompletionEvent = unsigned __int128;

// A counter's change in the one pass: its key is the time's bits shifted left by one (times are
// >= 0, so they order as their bits), plus one for a free at its task's start, which the events'
// run makes after that instant's allocations.
struct CounterChange {
  std::uint64_t key = 0;
  std::int64_t delta = 0;
};
inline constexpr std::uint64_t kNoChange = ~std::uint64_t{0};  // above every key (no NaN)
}  // namespace detail

struct CounterSample {
  double time = 0.0;
  std::int64_t value = 0;
};

class EventEngine {
 public:
  /// Forgets every task, resource and counter but keeps the memory.
  void clear();
  void reserve(std::size_t tasks) { tasks_.reserve(tasks); }

  int add_resource();
  int add_counter(std::int64_t initial_value);
  void set_counter_initial(int counter, std::int64_t value) { counters_[counter].initial = value; }

  /// Appends a task to `resource`'s queue; the order of calls is the resource's order.
  int add_task(int resource, double duration) {
    const int id = static_cast<int>(tasks_.size());
    tasks_.push_back({duration, 0, 0, 0.0, 0, -1, -1, -1, 0, {-1, -1}});
    dependencies_.push_back(0);
    resource_of_.push_back(resource);
    ++resources_[resource].count;
    queues_ready_ = false;
    return id;
  }
  void add_dependency(int before, int after) {
    Task& t = tasks_[before];
    if (t.successor_count < kInlineSuccessors) {
      t.successors[t.successor_count] = after;
    } else {
      more_successors_.emplace_back(before, after);
      queues_ready_ = false;
    }
    ++t.successor_count;
    ++dependencies_[after];
  }
  void set_duration(int task, double duration) { tasks_[task].duration = duration; }
  void set_start_effect(int task, int counter, std::int64_t bytes_allocated) {
    tasks_[task].start_counter = counter;
    tasks_[task].start_bytes = bytes_allocated;
  }
  /// Frees `bytes_freed` from the start effect's counter `offset` after the task starts (at its
  /// end at the latest); 0 bytes: none, negative: allocates.
  void set_mid_effect(int task, double offset, std::int64_t bytes_freed) {
    tasks_[task].mid_offset = offset;
    tasks_[task].mid_bytes = bytes_freed;
  }
  /// A second such effect, at an offset no earlier than the first's (a backward frees part of
  /// its peak where its peak layer is done with it, more when that layer ends).
  void set_late_effect(int task, double offset, std::int64_t bytes_freed) {
    const auto at = static_cast<std::size_t>(task);
    if (bytes_freed == 0 && at >= late_.size()) return;  // few tasks have one: kept apart
    if (late_.size() <= at) late_.resize(tasks_.size());
    late_[at] = {offset, bytes_freed};
  }
  void set_end_effect(int task, int counter, std::int64_t bytes_freed) {
    tasks_[task].end_counter = counter;
    tasks_[task].end_bytes = bytes_freed;
  }
  /// The task starts at `release` at the earliest and ends at `finish_floor` at the earliest.
  void set_pacing(int task, double release, double finish_floor) {
    if (pacing_.size() < tasks_.size()) pacing_.resize(tasks_.size());
    pacing_[task] = {release, finish_floor};
  }
  /// Forgets every task's pacing.
  void clear_pacing() { pacing_.clear(); }
  /// The task also holds `lock` (0, 1, ...) from its start to its end; -1: none.
  void set_lock(int task, int lock) {
    if (locks_.size() < tasks_.size()) locks_.resize(tasks_.size(), -1);
    locks_[task] = lock;
  }
  /// Forgets every task's lock.
  void clear_locks() { locks_.clear(); }

  /// Runs to completion; std::logic_error if some task can never start (a cycle). May be called
  /// again after changing durations, effects or initial values.
  void run(bool record_history);
  /// Whether the last run() took the one-pass way (for tests and benchmarks).
  bool last_run_in_one_pass() const { return last_run_in_one_pass_; }
  /// Tests only: every run() of every engine processes events, the reference the one pass is
  /// checked against.
  static void always_process_events(bool yes);
  /// How many run()s of any engine took the one pass since the program started (for tests).
  static std::uint64_t runs_in_one_pass();

  /// A task's memory effects as set above (counter -1: none).
  struct Effects {
    int start_counter = -1;
    std::int64_t start_bytes = 0;
    std::int64_t mid_bytes = 0;  ///< freed from start_counter
    int end_counter = -1;
    std::int64_t end_bytes = 0;
    double mid_offset = 0.0;      ///< after the start (at the end at the latest)
    std::int64_t late_bytes = 0;  ///< freed from start_counter, after the mid effect
    double late_offset = 0.0;
  };
  Effects effects(int task) const {
    const Task& t = tasks_[task];
    const Late late = static_cast<std::size_t>(task) < late_.size() ? late_[task] : Late{};
    return {t.start_counter, t.start_bytes, t.mid_bytes, t.end_counter,
            t.end_bytes,     t.mid_offset,  late.bytes,  late.offset};
  }
  double duration(int task) const { return tasks_[task].duration; }
  std::size_t counter_count() const { return counters_.size(); }
  std::int64_t initial(int counter) const { return counters_[counter].initial; }

  std::size_t task_count() const { return tasks_.size(); }
  std::size_t resource_count() const { return resources_.size(); }
  int resource_of(int task) const { return resource_of_[task]; }
  double start(int task) const { return start_[task]; }
  double finish(int task) const { return finish_[task]; }
  double makespan() const { return makespan_; }
  /// After run(): adds bytes to a counter at the makespan, as what a runtime allocates once
  /// every task is done.
  void allocate_at_end(int counter, std::int64_t bytes) { change(counter, bytes, makespan_); }
  std::int64_t peak(int counter) const { return counters_[counter].peak; }
  double peak_time(int counter) const { return counters_[counter].peak_time; }
  const std::vector<CounterSample>& history(int counter) const {
    return counters_[counter].history;
  }
  /// (before, after) pairs: the dependencies plus each resource's order.
  std::vector<std::pair<int, int>> edges() const;

 private:
  // Pipeline tasks have at most two successors (a forward feeds the next stage and its own
  // backward), so successors live in the task; more go to more_successors_.
  static constexpr int kInlineSuccessors = 2;
  // What run() reads of a task, in one cache line: the rest (its resource, its dependency
  // count, its late effect) lives apart. Its resource's order is one more edge, from each task
  // to the next on its resource (`next`): a task whose every edge is done heads an idle
  // resource, so run() needs no per-resource state.
  struct alignas(64) Task {
    double duration = 0.0;
    std::int64_t start_bytes = 0;
    std::int64_t end_bytes = 0;
    double mid_offset = 0.0;
    std::int64_t mid_bytes = 0;
    int next = -1;  // the next task on its resource (prepare_queues())
    int start_counter = -1;
    int end_counter = -1;
    int successor_count = 0;
    int successors[kInlineSuccessors];
  };
  static_assert(sizeof(Task) == 64);
  struct Late {
    double offset = 0.0;
    std::int64_t bytes = 0;
  };
  struct Resource {
    int count = 0;  // tasks on it
    int first = 0;  // its queue is queue_[first, first + count)
  };
  struct Counter {
    std::int64_t initial = 0;
    std::int64_t value = 0;
    std::int64_t peak = 0;
    double peak_time = 0.0;
    std::vector<CounterSample> history;
  };

  std::vector<int> lay_out_queues(std::vector<int>& queue) const;
  void prepare_queues();
  void reset_counters();
  struct EventRun;  // one run_by_events(), in event_engine.cpp
  void prepare_event_run();
  void run_by_events();
  [[noreturn]] void throw_where_stuck() const;
  bool run_in_one_pass();
  bool times_in_one_pass();
  bool changes_in_time_order();
  void replay_changes(int counter);
  void change(int counter, std::int64_t delta, double now) {
    Counter& c = counters_[counter];
    c.value += delta;
    if (c.value > c.peak) {
      c.peak = c.value;
      c.peak_time = now;
    }
    if (record_history_) record(c, now);
  }
  static void record(Counter& c, double now);

  std::vector<Task> tasks_;
  std::vector<int> dependencies_;  // per task
  std::vector<int> resource_of_;   // per task
  std::vector<Late> late_;         // empty, or per task (those beyond its end: none)
  std::vector<Resource> resources_;
  std::vector<Counter> counters_;
  struct Pacing {
    double release = 0.0, finish_floor = 0.0;
  };
  std::vector<Pacing> pacing_;  // empty, or per task (those beyond its end: none)
  std::vector<int> locks_;      // empty, or per task (-1, and those beyond its end: none)
  std::vector<std::pair<int, int>> more_successors_;  // (task, successor), sorted by task
  std::vector<int> more_begin_;                       // task -> first entry in more_successors_
  std::vector<int> queue_;        // every resource's tasks in order, resource after resource
  std::vector<int> topological_;  // every task after its edges' (empty: a cycle)
  bool queues_ready_ = false;
  bool last_run_in_one_pass_ = false;

  // Per-run state and scratch, kept to avoid allocating.
  std::vector<double> start_, finish_;
  std::vector<int> pending_;                    // unfinished dependencies
  std::vector<int> lock_holder_;                // per lock: its task, or -1
  std::vector<std::vector<int>> lock_waiters_;  // per lock, in the order they came
  std::vector<std::size_t> next_waiter_;        // per lock: its next waiter's index
  // Completions; mid effects as ~task, late ones as ~(task + task_count()); a paced task's
  // release as task + task_count().
  std::vector<detail::CompletionEvent> heap_;
  std::vector<int> startable_;  // at the head of an idle resource, every dependency done
  std::vector<int> batch_;      // tasks starting (or finishing) at the current instant
  // The one pass: each counter's changes in a region of changes_, each resource's in one run
  // that ends in a sentinel (key kNoChange); where each run begins.
  using Change = detail::CounterChange;
  std::vector<Change> changes_;
  std::vector<int> region_;          // per counter and one more: where its region begins
  std::vector<Change*> cursor_;      // per counter: where its next change goes
  std::vector<const Change*> runs_;  // per counter and resource: its runs' next changes
  std::vector<int> run_count_;       // per counter
  std::vector<int> last_resource_;   // per counter: the resource its last run is of
  bool record_history_ = false;
  double makespan_ = 0.0;
};

}  // namespace pipetune

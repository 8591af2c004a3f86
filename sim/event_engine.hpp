#pragma once

// The discrete-event engine under the simulator: small on purpose.
//
// A resource (a device's compute stream, one direction of a link) runs its tasks one at a time,
// in the order they were added to it. A task starts once the task before it on its resource and
// all its dependencies have finished, and holds the resource for its duration. Events are task
// completions, processed in time order; completions at the same instant are processed together,
// their frees applied before anything they enable starts.
//
// Counters (one per device) follow memory: a task may add bytes to one counter when it starts
// and subtract bytes from one counter when it ends. The engine keeps each counter's current
// value, its peak, and, when asked, its history.

#include <cstdint>
#include <vector>

namespace pipetune {

struct CounterSample {
  double time = 0.0;
  std::int64_t value = 0;
};

class EventEngine {
 public:
  int add_resource();
  int add_counter(std::int64_t initial_value);
  /// Appends a task to `resource`'s queue; the order of calls is the resource's order.
  int add_task(int resource, double duration);
  void add_dependency(int before, int after);
  void set_start_effect(int task, int counter, std::int64_t bytes_allocated);
  void set_end_effect(int task, int counter, std::int64_t bytes_freed);
  void reserve(std::size_t tasks, std::size_t dependencies);

  /// Runs to completion; std::logic_error if some task can never start (a cyclic programme).
  void run(bool record_history);

  std::size_t task_count() const { return tasks_.size(); }
  double start(int task) const { return start_[task]; }
  double finish(int task) const { return start_[task] + tasks_[task].duration; }
  double makespan() const { return makespan_; }
  std::int64_t peak(int counter) const { return counters_[counter].peak; }
  double peak_time(int counter) const { return counters_[counter].peak_time; }
  const std::vector<CounterSample>& history(int counter) const {
    return counters_[counter].history;
  }
  /// (before, after) pairs: the dependencies plus each resource's order.
  std::vector<std::pair<int, int>> edges() const;
  int resource_of(int task) const { return tasks_[task].resource; }

 private:
  struct Task {
    double duration = 0.0;
    int resource = 0;
    int pending = 0;  // unfinished dependencies
    int start_counter = -1;
    int end_counter = -1;
    std::int64_t start_bytes = 0;
    std::int64_t end_bytes = 0;
  };
  struct Resource {
    std::vector<int> queue;
    std::size_t head = 0;
    bool busy = false;
  };
  struct Counter {
    std::int64_t value = 0;
    std::int64_t peak = 0;
    double peak_time = 0.0;
    std::vector<CounterSample> history;
  };

  void start_ready_tasks(double now);
  void release(int task);
  void change(int counter, std::int64_t delta, double now);

  std::vector<Task> tasks_;
  std::vector<Resource> resources_;
  std::vector<Counter> counters_;
  std::vector<std::pair<int, int>> dependencies_;
  std::vector<int> successor_begin_, successors_;  // CSR built by run()
  std::vector<double> start_;
  std::vector<std::pair<double, int>> heap_;  // completion events, min-heap on time
  std::vector<int> ready_resources_;          // may be able to start their next task now
  std::vector<int> starting_;                 // tasks that take time, starting this instant
  std::size_t finished_count_ = 0;
  bool record_history_ = false;
  double makespan_ = 0.0;
};

}  // namespace pipetune

#include "sim/event_engine.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pipetune {

namespace {
// std::push_heap/pop_heap build a max-heap; this order makes the earliest completion the top,
// ties broken by task index so runs are deterministic.
struct Later {
  bool operator()(const std::pair<double, int>& a, const std::pair<double, int>& b) const {
    return a.first > b.first || (a.first == b.first && a.second > b.second);
  }
};
}  // namespace

int EventEngine::add_resource() {
  resources_.emplace_back();
  return static_cast<int>(resources_.size()) - 1;
}

int EventEngine::add_counter(std::int64_t initial_value) {
  Counter c;
  c.value = c.peak = initial_value;
  counters_.push_back(std::move(c));
  return static_cast<int>(counters_.size()) - 1;
}

int EventEngine::add_task(int resource, double duration) {
  const int id = static_cast<int>(tasks_.size());
  Task t;
  t.duration = duration;
  t.resource = resource;
  tasks_.push_back(t);
  resources_[resource].queue.push_back(id);
  return id;
}

void EventEngine::add_dependency(int before, int after) {
  dependencies_.emplace_back(before, after);
  ++tasks_[after].pending;
}

void EventEngine::set_start_effect(int task, int counter, std::int64_t bytes_allocated) {
  tasks_[task].start_counter = counter;
  tasks_[task].start_bytes = bytes_allocated;
}

void EventEngine::set_end_effect(int task, int counter, std::int64_t bytes_freed) {
  tasks_[task].end_counter = counter;
  tasks_[task].end_bytes = bytes_freed;
}

void EventEngine::reserve(std::size_t tasks, std::size_t dependencies) {
  tasks_.reserve(tasks);
  dependencies_.reserve(dependencies);
}

void EventEngine::change(int counter, std::int64_t delta, double now) {
  Counter& c = counters_[counter];
  c.value += delta;
  if (c.value > c.peak) {
    c.peak = c.value;
    c.peak_time = now;
  }
  if (record_history_) {
    if (!c.history.empty() && c.history.back().time == now) {
      c.history.back().value = c.value;
    } else {
      c.history.push_back({now, c.value});
    }
  }
}

void EventEngine::release(int task) {
  Resource& r = resources_[tasks_[task].resource];
  r.busy = false;
  ++r.head;
  ready_resources_.push_back(tasks_[task].resource);
  for (int k = successor_begin_[task]; k < successor_begin_[task + 1]; ++k) {
    const int next = successors_[k];
    if (--tasks_[next].pending == 0) ready_resources_.push_back(tasks_[next].resource);
  }
  ++finished_count_;
}

void EventEngine::start_ready_tasks(double now) {
  starting_.clear();
  while (!ready_resources_.empty()) {
    const int resource = ready_resources_.back();
    ready_resources_.pop_back();
    Resource& r = resources_[resource];
    if (r.busy || r.head == r.queue.size()) continue;
    const int id = r.queue[r.head];
    Task& t = tasks_[id];
    if (t.pending > 0) continue;
    start_[id] = now;
    if (t.duration == 0.0) {
      // Done within the instant: its allocation and its free both happen before anything that
      // takes time starts.
      if (t.start_counter >= 0 && t.start_bytes != 0) change(t.start_counter, t.start_bytes, now);
      if (t.end_counter >= 0 && t.end_bytes != 0) change(t.end_counter, -t.end_bytes, now);
      release(id);
      makespan_ = std::max(makespan_, now);
    } else {
      r.busy = true;
      starting_.push_back(id);
    }
  }
  for (int id : starting_) {
    const Task& t = tasks_[id];
    if (t.start_counter >= 0 && t.start_bytes != 0) change(t.start_counter, t.start_bytes, now);
    heap_.emplace_back(now + t.duration, id);
    std::push_heap(heap_.begin(), heap_.end(), Later{});
  }
}

void EventEngine::run(bool record_history) {
  record_history_ = record_history;
  const std::size_t n = tasks_.size();
  // Successors in compressed rows: one allocation instead of one vector per task.
  successor_begin_.assign(n + 1, 0);
  for (const auto& [before, after] : dependencies_) ++successor_begin_[before + 1];
  for (std::size_t i = 0; i < n; ++i) successor_begin_[i + 1] += successor_begin_[i];
  successors_.resize(dependencies_.size());
  {
    std::vector<int> fill(successor_begin_.begin(), successor_begin_.end() - 1);
    for (const auto& [before, after] : dependencies_) successors_[fill[before]++] = after;
  }
  start_.assign(n, -1.0);
  heap_.clear();
  heap_.reserve(resources_.size() + 1);
  finished_count_ = 0;
  makespan_ = 0.0;
  for (auto& c : counters_) {
    if (record_history_) c.history.assign(1, {0.0, c.value});
  }

  for (int r = static_cast<int>(resources_.size()) - 1; r >= 0; --r) ready_resources_.push_back(r);
  start_ready_tasks(0.0);
  std::vector<int> finished;
  while (!heap_.empty()) {
    const double now = heap_.front().first;
    finished.clear();
    while (!heap_.empty() && heap_.front().first == now) {
      finished.push_back(heap_.front().second);
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      heap_.pop_back();
    }
    for (int id : finished) {
      const Task& t = tasks_[id];
      if (t.end_counter >= 0 && t.end_bytes != 0) change(t.end_counter, -t.end_bytes, now);
    }
    for (int id : finished) release(id);
    makespan_ = now;
    start_ready_tasks(now);
  }
  if (finished_count_ != n) {
    for (std::size_t r = 0; r < resources_.size(); ++r) {
      if (resources_[r].head < resources_[r].queue.size()) {
        throw std::logic_error("event engine: resource " + std::to_string(r) +
                               " is stuck at task " +
                               std::to_string(resources_[r].queue[resources_[r].head]) +
                               " (the programme has a cycle)");
      }
    }
    throw std::logic_error("event engine: not every task ran");
  }
}

std::vector<std::pair<int, int>> EventEngine::edges() const {
  std::vector<std::pair<int, int>> out = dependencies_;
  for (const auto& r : resources_) {
    for (std::size_t k = 1; k < r.queue.size(); ++k) out.emplace_back(r.queue[k - 1], r.queue[k]);
  }
  return out;
}

}  // namespace pipetune

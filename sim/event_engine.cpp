#include "sim/event_engine.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string>

// Forces a lambda inline (GCC and Clang): the engine's loop is one function with its state in
// registers.
#if defined(__GNUC__)
#define PIPETUNE_INLINE __attribute__((always_inline))
#else
#define PIPETUNE_INLINE
#endif

namespace pipetune {

namespace {

using Event = detail::CompletionEvent;

// Earlier first; ties by task index so runs are deterministic (a mid effect, ~task, is negative
// and a late one, ~(task + n), more so: both come before every completion at their instant, the
// late before the mid, and all of them only free). Keys are unique, so the order is total and any
// correct heap pops the same sequence.
inline std::uint64_t time_key(double time) {
  // + 0.0 turns -0.0 into 0.0, so that times equal as doubles have one key.
  const auto bits = std::bit_cast<std::uint64_t>(time + 0.0);
  return bits >> 63 ? ~bits : bits | (std::uint64_t{1} << 63);
}
inline double key_time(std::uint64_t key) {
  return std::bit_cast<double>(key >> 63 ? key & ~(std::uint64_t{1} << 63) : ~key);
}
inline Event make_event(double time, int task) {
  const std::uint32_t biased = static_cast<std::uint32_t>(task) ^ 0x80000000u;
  return (static_cast<Event>(time_key(time)) << 64) | biased;
}
inline double event_time(Event e) {
  return key_time(static_cast<std::uint64_t>(e >> 64));
}
inline int event_task(Event e) {
  return static_cast<int>(static_cast<std::uint32_t>(e) ^ 0x80000000u);
}
inline bool before(Event a, Event b) {
  return a < b;
}

// A 4-ary min-heap on a caller's array (half a binary heap's depth; a node's four children
// share a cache line): the loop below keeps its state in locals so the compiler can keep it in
// registers.
inline void heap_push(Event* heap, int& size, Event e) {
  int hole = size++;
  while (hole > 0) {
    const int parent = (hole - 1) / 4;
    if (!before(e, heap[parent])) break;
    heap[hole] = heap[parent];
    hole = parent;
  }
  heap[hole] = e;
}

// The smallest of the children [first, first + 4) ∩ [first, size).
inline int smallest_child(const Event* heap, int first, int size) {
  if (first + 4 <= size) {  // all four: two independent comparisons, then one
    const int a = first + (before(heap[first + 1], heap[first]) ? 1 : 0);
    const int b = first + 2 + (before(heap[first + 3], heap[first + 2]) ? 1 : 0);
    return before(heap[b], heap[a]) ? b : a;
  }
  int best = first;
  for (int c = first + 1; c < size; ++c) best = before(heap[c], heap[best]) ? c : best;
  return best;
}

// Bottom-up: the hole sinks to a leaf along the smallest children (no comparison with the last
// element on the way down), then the last element rises from there, usually a step or none.
inline Event heap_pop(Event* heap, int& size) {
  const Event top = heap[0];
  const Event last = heap[--size];
  int hole = 0;
  for (int first = 1; first < size; first = 4 * hole + 1) {
    const int child = smallest_child(heap, first, size);
    heap[hole] = heap[child];
    hole = child;
  }
  while (hole > 0) {
    const int parent = (hole - 1) / 4;
    if (!before(last, heap[parent])) break;
    heap[hole] = heap[parent];
    hole = parent;
  }
  heap[hole] = last;
  return top;
}

}  // namespace

void EventEngine::clear() {
  tasks_.clear();
  dependencies_.clear();
  resource_of_.clear();
  late_.clear();
  resources_.clear();
  counters_.clear();
  more_successors_.clear();
  pacing_.clear();
  locks_.clear();
  queues_ready_ = false;
  makespan_ = 0.0;
}

int EventEngine::add_resource() {
  resources_.emplace_back();
  queues_ready_ = false;
  return static_cast<int>(resources_.size()) - 1;
}

int EventEngine::add_counter(std::int64_t initial_value) {
  Counter c;
  c.initial = initial_value;
  counters_.push_back(std::move(c));
  return static_cast<int>(counters_.size()) - 1;
}

void EventEngine::record(Counter& c, double now) {
  if (!c.history.empty() && c.history.back().time == now) {
    c.history.back().value = c.value;
  } else {
    c.history.push_back({now, c.value});
  }
}

// Every resource's tasks in the order they were added, resource after resource, into `queue`
// (a stable counting sort); returns where each resource's run starts.
std::vector<int> EventEngine::lay_out_queues(std::vector<int>& queue) const {
  std::vector<int> first(resources_.size(), 0);
  for (std::size_t r = 1; r < resources_.size(); ++r)
    first[r] = first[r - 1] + resources_[r - 1].count;
  std::vector<int> fill = first;
  queue.resize(tasks_.size());
  for (std::size_t id = 0; id < tasks_.size(); ++id)
    queue[fill[resource_of_[id]]++] = static_cast<int>(id);
  return first;
}

// Resource queues in one array, in the order tasks were added (a stable counting sort), and
// the overflow successors grouped by task.
void EventEngine::prepare_queues() {
  const int n = static_cast<int>(tasks_.size());
  const std::vector<int> first = lay_out_queues(queue_);
  for (std::size_t r = 0; r < resources_.size(); ++r) {
    resources_[r].first = first[r];
    const int end = first[r] + resources_[r].count;
    for (int k = first[r]; k < end; ++k) tasks_[queue_[k]].next = k + 1 < end ? queue_[k + 1] : -1;
  }
  if (!more_successors_.empty()) {
    std::stable_sort(more_successors_.begin(), more_successors_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    more_begin_.assign(n + 1, 0);
    for (const auto& [task, successor] : more_successors_) ++more_begin_[task + 1];
    for (int i = 0; i < n; ++i) more_begin_[i + 1] += more_begin_[i];
  }
  queues_ready_ = true;
}

void EventEngine::run(bool record_history) {
  if (!queues_ready_) prepare_queues();
  record_history_ = record_history;
  const int n = static_cast<int>(tasks_.size());
  const int resource_count = static_cast<int>(resources_.size());
  start_.assign(n, -1.0);
  finish_.assign(n, -1.0);
  const int paced = static_cast<int>(std::min<std::size_t>(pacing_.size(), tasks_.size()));
  const int locked = static_cast<int>(std::min<std::size_t>(locks_.size(), tasks_.size()));
  const int lock_count =
      locked > 0 ? 1 + *std::max_element(locks_.begin(), locks_.begin() + locked) : 0;
  // A lock's holder: the task running with it, or the waiter it was handed to (-1: free).
  lock_holder_.assign(lock_count, -1);
  lock_waiters_.resize(lock_count);
  for (auto& waiters : lock_waiters_) waiters.clear();
  next_waiter_.assign(lock_count, 0);
  pending_.resize(n);
  for (int id = 0; id < n; ++id) pending_[id] = dependencies_[id];
  for (int id = 0; id < n; ++id) {
    if (tasks_[id].next >= 0) ++pending_[tasks_[id].next];  // the resource order's edge
  }
  makespan_ = 0.0;
  for (auto& c : counters_) {
    c.value = c.peak = c.initial;
    c.peak_time = 0.0;
    c.history.clear();
    if (record_history_) c.history.push_back({0.0, c.value});
  }

  // Each task becomes startable once, each resource holds one running task: fixed bounds.
  startable_.resize(n);
  batch_.resize(resource_count + 1);
  // A completion and two mid effects per running task, a release per resource's head.
  heap_.resize(4 * resource_count + 1);
  const Task* const tasks = tasks_.data();
  const int* const queue = queue_.data();
  double* const start = start_.data();
  double* const finish = finish_.data();
  const Pacing* const pacing = pacing_.data();
  const Late* const late = late_.data();
  const int lated = static_cast<int>(std::min<std::size_t>(late_.size(), tasks_.size()));
  int* const pending = pending_.data();
  const int* const locks = locks_.data();
  const int* const more_begin = more_begin_.data();
  int* const startable = startable_.data();
  int* const batch = batch_.data();
  Event* const heap = heap_.data();
  int startable_count = 0, heap_size = 0, finished = 0;

  // Inlined: called once per task; as calls they reload every captured pointer.
  // A task with every edge done (its dependencies and the task before it on its resource)
  // heads an idle resource: it can start.
  auto notify = [&](int next) PIPETUNE_INLINE {
    if (--pending[next] == 0) startable[startable_count++] = next;
  };
  // A finished task frees its resource; the next task there, and any successor that now has
  // every dependency and heads an idle resource, can start (the next one first, as before).
  auto release = [&](int id) PIPETUNE_INLINE {
    const Task& t = tasks[id];
    if (id < locked && locks[id] >= 0) {
      // Handed straight to its longest waiter, so that a task ready at this instant cannot
      // take it first.
      const int lock = locks[id];
      lock_holder_[lock] = -1;
      if (next_waiter_[lock] < lock_waiters_[lock].size()) {
        lock_holder_[lock] = lock_waiters_[lock][next_waiter_[lock]++];
        startable[startable_count++] = lock_holder_[lock];
      }
    }
    if (t.next >= 0) notify(t.next);
    const int inline_count = std::min(t.successor_count, kInlineSuccessors);
    for (int k = 0; k < inline_count; ++k) notify(t.successors[k]);
    if (t.successor_count > kInlineSuccessors) {
      for (int k = more_begin[id]; k < more_begin[id + 1]; ++k) notify(more_successors_[k].second);
    }
    ++finished;
  };
  // Zero-duration tasks run to completion at once; the others start after all of them, so an
  // instant's frees come before its allocations. A paced task before its release waits for it
  // (its resource stays idle: nothing else may run there before it).
  auto start_ready = [&](double now) PIPETUNE_INLINE {
    int starting = 0;
    while (startable_count > 0) {
      const int id = startable[--startable_count];
      const Task& t = tasks[id];
      double end = now + t.duration;
      if (id < paced) {
        if (pacing[id].release > now) {
          heap_push(heap, heap_size, make_event(pacing[id].release, id + n));
          continue;
        }
        end = std::max(end, pacing[id].finish_floor);
      }
      if (id < locked && locks[id] >= 0) {
        const int lock = locks[id];
        if (lock_holder_[lock] >= 0 && lock_holder_[lock] != id) {
          lock_waiters_[lock].push_back(id);
          continue;
        }
        lock_holder_[lock] = id;
      }
      start[id] = now;
      finish[id] = end;
      if (t.duration == 0.0 && end == now) {
        if (t.start_bytes != 0) change(t.start_counter, t.start_bytes, now);
        if (t.mid_bytes != 0) change(t.start_counter, -t.mid_bytes, now);
        if (id < lated && late[id].bytes != 0) change(t.start_counter, -late[id].bytes, now);
        if (t.end_bytes != 0) change(t.end_counter, -t.end_bytes, now);
        release(id);
        if (now > makespan_) makespan_ = now;
      } else {
        batch[starting++] = id;
      }
    }
    for (int k = 0; k < starting; ++k) {
      const Task& t = tasks[batch[k]];
      if (t.start_bytes != 0) change(t.start_counter, t.start_bytes, now);
      heap_push(heap, heap_size, make_event(finish[batch[k]], batch[k]));
      if (t.mid_bytes != 0) {
        const double mid = std::min(now + t.mid_offset, finish[batch[k]]);
        heap_push(heap, heap_size, make_event(mid, ~batch[k]));
      }
      if (batch[k] < lated && late[batch[k]].bytes != 0) {
        const double at = std::min(now + late[batch[k]].offset, finish[batch[k]]);
        heap_push(heap, heap_size, make_event(at, ~(batch[k] + n)));
      }
    }
  };

  for (int r = resource_count - 1; r >= 0; --r) {
    const int first = resources_[r].first;
    if (resources_[r].count > 0 && pending[queue[first]] == 0)
      startable[startable_count++] = queue[first];
  }
  start_ready(0.0);
  while (heap_size > 0) {
    const auto now_key = static_cast<std::uint64_t>(heap[0] >> 64);
    const double now = key_time(now_key);
    // Every completion and mid effect at this instant: frees first, then releases.
    int count = 0;
    while (heap_size > 0 && static_cast<std::uint64_t>(heap[0] >> 64) == now_key) {
      const int id = event_task(heap_pop(heap, heap_size));
      if (id >= n) {  // a paced task's release
        startable[startable_count++] = id - n;
        continue;
      }
      if (id < 0) {  // ~task: its mid effect; ~(task + n): its late one
        const bool is_late = ~id >= n;
        const int task = is_late ? ~id - n : ~id;
        change(tasks[task].start_counter, is_late ? -late[task].bytes : -tasks[task].mid_bytes,
               now);
        continue;
      }
      const Task& t = tasks[id];
      if (t.end_bytes != 0) change(t.end_counter, -t.end_bytes, now);
      batch[count++] = id;
    }
    for (int k = 0; k < count; ++k) release(batch[k]);
    makespan_ = now;
    start_ready(now);
  }
  if (finished != n) {
    // Every task that started has finished: a resource's first task that never started is
    // where it stuck.
    for (int r = 0; r < resource_count; ++r) {
      for (int k = resources_[r].first; k < resources_[r].first + resources_[r].count; ++k) {
        if (start[queue[k]] != -1.0) continue;  // it started (run() starts every task at -1)
        throw std::logic_error("event engine: resource " + std::to_string(r) +
                               " is stuck at task " + std::to_string(queue[k]) +
                               " (the programme has a cycle)");
      }
    }
    throw std::logic_error("event engine: not every task ran");
  }
}

std::vector<std::pair<int, int>> EventEngine::edges() const {
  std::vector<std::pair<int, int>> out;
  for (std::size_t id = 0; id < tasks_.size(); ++id) {
    const Task& t = tasks_[id];
    for (int k = 0; k < std::min(t.successor_count, kInlineSuccessors); ++k) {
      out.emplace_back(static_cast<int>(id), t.successors[k]);
    }
  }
  out.insert(out.end(), more_successors_.begin(), more_successors_.end());
  // Each resource's order, laid out here as run() lays out its queues, so that the edges are
  // right before any run too.
  std::vector<int> order;
  const std::vector<int> first = lay_out_queues(order);
  for (std::size_t r = 0; r < resources_.size(); ++r) {
    for (int k = first[r] + 1; k < first[r] + resources_[r].count; ++k)
      out.emplace_back(order[k - 1], order[k]);
  }
  return out;
}

}  // namespace pipetune

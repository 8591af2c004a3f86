#include "sim/event_engine.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string>

// Forces a lambda or a function inline (GCC and Clang): the engine's loop is one function with
// its state in registers.
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

// Tests set it to check the one pass against the events' run.
std::atomic<bool> always_process_events_flag{false};
std::atomic<std::uint64_t> one_pass_count{0};

// A change's key in the one pass: the time's bits (a time >= 0 orders as its bits) shifted left,
// and one for a free at its task's start, which the engine makes after the instant's starts.
inline std::uint64_t change_key(double time, bool after_starts) {
  return std::bit_cast<std::uint64_t>(time + 0.0) << 1 | (after_starts ? 1 : 0);
}
inline double change_time(std::uint64_t key) {
  return std::bit_cast<double>(key >> 1);
}

}  // namespace

void EventEngine::always_process_events(bool yes) {
  always_process_events_flag.store(yes, std::memory_order_relaxed);
}

std::uint64_t EventEngine::runs_in_one_pass() {
  return one_pass_count.load(std::memory_order_relaxed);
}

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
  // Kahn's order over the dependencies and the resources' orders; short of n tasks: a cycle.
  std::vector<int> waiting(dependencies_);
  for (int id = 0; id < n; ++id) {
    if (tasks_[id].next >= 0) ++waiting[tasks_[id].next];
  }
  topological_.clear();
  topological_.reserve(n);
  for (int id = 0; id < n; ++id) {
    if (waiting[id] == 0) topological_.push_back(id);
  }
  for (std::size_t k = 0; k < topological_.size(); ++k) {
    const int id = topological_[k];
    const Task& t = tasks_[id];
    const auto done = [&](int after) {
      if (--waiting[after] == 0) topological_.push_back(after);
    };
    if (t.next >= 0) done(t.next);
    for (int j = 0; j < std::min(t.successor_count, kInlineSuccessors); ++j) done(t.successors[j]);
    if (t.successor_count > kInlineSuccessors) {
      for (int j = more_begin_[id]; j < more_begin_[id + 1]; ++j) done(more_successors_[j].second);
    }
  }
  if (static_cast<int>(topological_.size()) != n) topological_.clear();
  queues_ready_ = true;
}

void EventEngine::reset_counters() {
  for (auto& c : counters_) {
    c.value = c.peak = c.initial;
    c.peak_time = 0.0;
    c.history.clear();
    if (record_history_) c.history.push_back({0.0, c.value});
  }
}

void EventEngine::run(bool record_history) {
  if (!queues_ready_) prepare_queues();
  record_history_ = record_history;
  makespan_ = 0.0;
  last_run_in_one_pass_ =
      !always_process_events_flag.load(std::memory_order_relaxed) && run_in_one_pass();
  if (last_run_in_one_pass_) {
    one_pass_count.fetch_add(1, std::memory_order_relaxed);
  } else {
    run_by_events();
  }
}

bool EventEngine::run_in_one_pass() {
  const std::size_t n = tasks_.size();
  if (topological_.size() != n) return false;  // a cycle: the events' run says where
  const std::size_t locked = std::min(locks_.size(), n);
  for (std::size_t id = 0; id < locked; ++id) {
    if (locks_[id] >= 0) return false;  // who gets a lock depends on who came first
  }
  if (!times_in_one_pass() || !changes_in_time_order()) return false;
  reset_counters();
  for (int c = 0; c < static_cast<int>(counters_.size()); ++c) replay_changes(c);
  return true;
}

// A task starts at the latest end of its edges (its release, if paced, at the earliest) and ends
// its duration later (its floor, if paced, at the earliest): the events' times to the bit.
// False where a task's time is lost to rounding (a task that takes time but ends as it starts
// would free after its instant's allocations) or is negative.
bool EventEngine::times_in_one_pass() {
  const int n = static_cast<int>(tasks_.size());
  start_.assign(n, 0.0);  // each task's latest edge so far, then its start
  finish_.resize(n);
  const Task* const tasks = tasks_.data();
  double* const start = start_.data();
  double* const finish = finish_.data();
  const Pacing* const pacing = pacing_.data();
  const int paced = static_cast<int>(std::min<std::size_t>(pacing_.size(), tasks_.size()));
  const int* const more_begin = more_begin_.data();
  double makespan = 0.0;
  for (const int id : topological_) {
    const Task& t = tasks[id];
    double begin = start[id];
    double end = begin + t.duration;
    if (id < paced) {
      begin = std::max(begin, pacing[id].release);
      end = std::max(begin + t.duration, pacing[id].finish_floor);
    }
    if (!(end > begin) && !(t.duration == 0.0 && end == begin)) return false;
    start[id] = begin;
    finish[id] = end;
    makespan = std::max(makespan, end);
    const auto reach = [&](int after)
                           PIPETUNE_INLINE { start[after] = std::max(start[after], end); };
    if (t.next >= 0) reach(t.next);
    const int inline_count = std::min(t.successor_count, kInlineSuccessors);
    for (int k = 0; k < inline_count; ++k) reach(t.successors[k]);
    if (t.successor_count > kInlineSuccessors) {
      for (int k = more_begin[id]; k < more_begin[id + 1]; ++k) reach(more_successors_[k].second);
    }
  }
  makespan_ = makespan;
  return true;
}

// Each counter's changes, resource by resource, each resource's in its order, which is their
// time order: a task's changes lie within it and the next task starts after it ends. False where
// the instant's order would matter: an allocation by a task without time (it peaks in the middle
// of the instant's frees), an allocation at a mid or an end (among the frees), a free at a start.
bool EventEngine::changes_in_time_order() {
  const int counters = static_cast<int>(counters_.size());
  const int resources = static_cast<int>(resources_.size());
  // Each counter's region of changes_: room for a start, two transients and an end of every
  // task that names it, and a sentinel after each run (a resource's).
  region_.assign(static_cast<std::size_t>(counters) + 1, 0);
  for (const Task& t : tasks_) {
    if (t.start_counter >= 0 && t.start_counter < counters) region_[t.start_counter + 1] += 3;
    if (t.end_counter >= 0 && t.end_counter < counters) region_[t.end_counter + 1] += 1;
  }
  for (int c = 0; c < counters; ++c) region_[c + 1] += region_[c] + resources;
  if (changes_.size() < static_cast<std::size_t>(region_[counters]))
    changes_.resize(static_cast<std::size_t>(region_[counters]));
  cursor_.resize(static_cast<std::size_t>(counters));
  for (int c = 0; c < counters; ++c) cursor_[c] = changes_.data() + region_[c];
  runs_.assign(static_cast<std::size_t>(counters) * resources, nullptr);
  run_count_.assign(static_cast<std::size_t>(counters), 0);
  last_resource_.assign(static_cast<std::size_t>(counters), -1);

  const Late* const late = late_.data();
  const int lated = static_cast<int>(std::min<std::size_t>(late_.size(), tasks_.size()));
  Change** const cursor = cursor_.data();
  int resource = 0;
  const auto add = [&](int counter, double time, std::int64_t delta,
                       bool after_starts) PIPETUNE_INLINE {
    if (counter < 0 || counter >= counters || !(time >= 0.0)) return false;
    if (last_resource_[counter] != resource) {
      if (last_resource_[counter] >= 0)  // the last run ends
        *cursor[counter]++ = {detail::kNoChange, 0};
      last_resource_[counter] = resource;
      runs_[static_cast<std::size_t>(counter) * resources + run_count_[counter]++] =
          cursor[counter];
    }
    *cursor[counter]++ = {change_key(time, after_starts), delta};
    return true;
  };
  for (; resource < resources; ++resource) {
    const int first = resources_[resource].first;
    for (int k = first; k < first + resources_[resource].count; ++k) {
      const int id = queue_[k];
      const Task& t = tasks_[id];
      const double begin = start_[id], end = finish_[id];
      const bool instant = end == begin;
      if (t.start_bytes != 0) {
        if (t.start_bytes < 0 || instant) return false;
        if (!add(t.start_counter, begin, t.start_bytes, false)) return false;
      }
      // The transients' ends, earlier first.
      std::pair<double, std::int64_t> freed[2];
      int count = 0;
      if (t.mid_bytes != 0) freed[count++] = {std::min(begin + t.mid_offset, end), t.mid_bytes};
      if (id < lated && late[id].bytes != 0)
        freed[count++] = {std::min(begin + late[id].offset, end), late[id].bytes};
      if (count == 2 && freed[1].first < freed[0].first) std::swap(freed[0], freed[1]);
      for (int j = 0; j < count; ++j) {
        const double at = instant ? begin : freed[j].first;
        if (freed[j].second < 0) return false;
        if (!add(t.start_counter, at, -freed[j].second, !instant && at == begin)) return false;
      }
      if (t.end_bytes != 0) {
        if (t.end_bytes < 0) return false;
        if (!add(t.end_counter, end, -t.end_bytes, false)) return false;
      }
    }
  }
  for (int c = 0; c < counters; ++c) {
    if (run_count_[c] > 0) *cursor[c]++ = {detail::kNoChange, 0};
  }
  return true;
}

namespace {

// A counter's value, its peak and when it first reached it, as the merge goes.
struct Replay {
  std::int64_t value = 0, peak = 0;
  double peak_time = 0.0;

  // The merge reaches a change with `key`: where the key moves on, the instant (or its frees at
  // starts) before it is over, and its value is one the events' run passes through.
  void reach(std::uint64_t key, std::uint64_t& instant) {
    if (key == instant) return;
    if (value > peak && instant != detail::kNoChange) {
      peak = value;
      peak_time = change_time(instant);
    }
    instant = key;
  }
};

// The merge of up to K runs of changes, each ending in a sentinel, with no history: every cursor
// and key in registers (K is a constant and every update is a select), as the run that holds the
// earliest change is data, not a pattern a branch could learn.
template <int K>
Replay replay_in_registers(const detail::CounterChange* const* first, int run_count, Replay r) {
  static const detail::CounterChange kEnd{detail::kNoChange, 0};
  const detail::CounterChange* at[K];
  std::uint64_t key[K];
  for (int j = 0; j < K; ++j) {
    at[j] = j < run_count ? first[j] : &kEnd;
    key[j] = at[j]->key;
  }
  std::uint64_t instant = detail::kNoChange;
  for (;;) {
    std::uint64_t next_key = key[0];
    for (int j = 1; j < K; ++j) next_key = key[j] < next_key ? key[j] : next_key;
    r.reach(next_key, instant);
    if (next_key == detail::kNoChange) break;
    // Exactly one run moves on: the first holding the earliest key.
    bool moved = false;
    for (int j = 0; j < K; ++j) {
      const bool move = !moved && key[j] == next_key;
      moved = moved || move;
      r.value += move ? at[j]->delta : 0;
      at[j] += move ? 1 : 0;
      key[j] = at[j]->key;
    }
  }
  return r;
}

}  // namespace

// A counter's changes merged in time order, an instant's changes at once: with frees and
// allocations not mixed within a phase, the instant's highest value is where its allocations
// end, before the frees at its starts.
void EventEngine::replay_changes(int counter) {
  Counter& c = counters_[static_cast<std::size_t>(counter)];
  const int run_count = run_count_[static_cast<std::size_t>(counter)];
  if (run_count == 0) return;  // it stays at its initial value
  // Each run's next change (runs_ is this run's scratch: its cursors move on in place).
  const Change** const head = runs_.data() + static_cast<std::size_t>(counter) * resources_.size();
  Replay r{c.initial, c.peak, c.peak_time};
  if (!record_history_ && run_count <= 8) {
    r = run_count <= 2   ? replay_in_registers<2>(head, run_count, r)
        : run_count <= 4 ? replay_in_registers<4>(head, run_count, r)
                         : replay_in_registers<8>(head, run_count, r);
  } else {
    std::uint64_t instant = detail::kNoChange;
    for (;;) {
      int next = 0;
      for (int j = 1; j < run_count; ++j) next = head[j]->key < head[next]->key ? j : next;
      const std::uint64_t next_key = head[next]->key;
      r.reach(next_key, instant);
      if (next_key == detail::kNoChange) break;
      r.value += head[next]++->delta;
      if (record_history_) {
        c.value = r.value;
        record(c, change_time(next_key));
      }
    }
  }
  c.value = r.value;
  c.peak = r.peak;
  c.peak_time = r.peak_time;
}

// Pending edges, lock state and scratch for a run by events: each task waits for its
// dependencies and the task before it on its resource (the resource order's edge).
void EventEngine::prepare_event_run() {
  const int n = static_cast<int>(tasks_.size());
  const int resource_count = static_cast<int>(resources_.size());
  start_.assign(n, -1.0);
  finish_.assign(n, -1.0);
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
    if (tasks_[id].next >= 0) ++pending_[tasks_[id].next];
  }
  makespan_ = 0.0;
  reset_counters();
  // Each task becomes startable once, each resource holds one running task: fixed bounds.
  startable_.resize(n);
  batch_.resize(resource_count + 1);
  // A completion and two mid effects per running task, a release per resource's head.
  heap_.resize(4 * resource_count + 1);
}

// One run by events. The engine's arrays and the run's counts are this object's, a local of
// run_by_events() whose calls are all inlined, so they stay in registers through the loop (as
// the engine's members, every call would reload them).
struct EventEngine::EventRun {
  EventEngine& engine;
  const int n;
  const int paced, locked, lated;
  const Task* const tasks;
  double* const start;
  double* const finish;
  const Pacing* const pacing;
  const Late* const late;
  int* const pending;
  const int* const locks;
  const int* const more_begin;
  int* const startable;
  int* const batch;
  Event* const heap;
  int startable_count = 0, heap_size = 0, finished = 0;

  explicit EventRun(EventEngine& e)
      : engine(e),
        n(static_cast<int>(e.tasks_.size())),
        paced(static_cast<int>(std::min<std::size_t>(e.pacing_.size(), e.tasks_.size()))),
        locked(static_cast<int>(std::min<std::size_t>(e.locks_.size(), e.tasks_.size()))),
        lated(static_cast<int>(std::min<std::size_t>(e.late_.size(), e.tasks_.size()))),
        tasks(e.tasks_.data()),
        start(e.start_.data()),
        finish(e.finish_.data()),
        pacing(e.pacing_.data()),
        late(e.late_.data()),
        pending(e.pending_.data()),
        locks(e.locks_.data()),
        more_begin(e.more_begin_.data()),
        startable(e.startable_.data()),
        batch(e.batch_.data()),
        heap(e.heap_.data()) {}

  // The head of each resource whose dependencies are none.
  PIPETUNE_INLINE void start_resource_heads() {
    for (int r = static_cast<int>(engine.resources_.size()) - 1; r >= 0; --r) {
      const int first = engine.resources_[r].first;
      if (engine.resources_[r].count > 0 && pending[engine.queue_[first]] == 0)
        startable[startable_count++] = engine.queue_[first];
    }
  }

  // A task with every edge done (its dependencies and the task before it on its resource)
  // heads an idle resource: it can start.
  PIPETUNE_INLINE void notify(int next) {
    if (--pending[next] == 0) startable[startable_count++] = next;
  }

  // A lock's task is done: the lock goes straight to its longest waiter, so that a task ready
  // at this instant cannot take it first.
  PIPETUNE_INLINE void hand_on_lock(int lock) {
    engine.lock_holder_[lock] = -1;
    if (engine.next_waiter_[lock] < engine.lock_waiters_[lock].size()) {
      engine.lock_holder_[lock] = engine.lock_waiters_[lock][engine.next_waiter_[lock]++];
      startable[startable_count++] = engine.lock_holder_[lock];
    }
  }

  // A finished task frees its resource; the next task there, and any successor that now has
  // every dependency and heads an idle resource, can start (the next one first).
  PIPETUNE_INLINE void release(int id) {
    const Task& t = tasks[id];
    if (id < locked && locks[id] >= 0) hand_on_lock(locks[id]);
    if (t.next >= 0) notify(t.next);
    const int inline_count = std::min(t.successor_count, kInlineSuccessors);
    for (int k = 0; k < inline_count; ++k) notify(t.successors[k]);
    if (t.successor_count > kInlineSuccessors) {
      for (int k = more_begin[id]; k < more_begin[id + 1]; ++k)
        notify(engine.more_successors_[k].second);
    }
    ++finished;
  }

  // Whether a startable task starts now, and when it ends. A paced task before its release
  // waits for it (its resource stays idle: nothing else may run there before it); a task whose
  // lock another holds joins its waiters.
  PIPETUNE_INLINE bool starts_now(int id, double now, double& end) {
    end = now + tasks[id].duration;
    if (id < paced) {
      if (pacing[id].release > now) {
        heap_push(heap, heap_size, make_event(pacing[id].release, id + n));
        return false;
      }
      end = std::max(end, pacing[id].finish_floor);
    }
    if (id < locked && locks[id] >= 0) {
      const int lock = locks[id];
      if (engine.lock_holder_[lock] >= 0 && engine.lock_holder_[lock] != id) {
        engine.lock_waiters_[lock].push_back(id);
        return false;
      }
      engine.lock_holder_[lock] = id;
    }
    return true;
  }

  // A task without time runs to completion at once, its every effect at this instant.
  PIPETUNE_INLINE void run_at_once(int id, double now) {
    const Task& t = tasks[id];
    if (t.start_bytes != 0) engine.change(t.start_counter, t.start_bytes, now);
    if (t.mid_bytes != 0) engine.change(t.start_counter, -t.mid_bytes, now);
    if (id < lated && late[id].bytes != 0) engine.change(t.start_counter, -late[id].bytes, now);
    if (t.end_bytes != 0) engine.change(t.end_counter, -t.end_bytes, now);
    release(id);
    if (now > engine.makespan_) engine.makespan_ = now;
  }

  // A task that takes time allocates at its start; its end and transients' frees are events.
  PIPETUNE_INLINE void begin(int id, double now) {
    const Task& t = tasks[id];
    if (t.start_bytes != 0) engine.change(t.start_counter, t.start_bytes, now);
    heap_push(heap, heap_size, make_event(finish[id], id));
    if (t.mid_bytes != 0) {
      const double mid = std::min(now + t.mid_offset, finish[id]);
      heap_push(heap, heap_size, make_event(mid, ~id));
    }
    if (id < lated && late[id].bytes != 0) {
      const double at = std::min(now + late[id].offset, finish[id]);
      heap_push(heap, heap_size, make_event(at, ~(id + n)));
    }
  }

  // Zero-duration tasks run to completion at once; the others start after all of them, so an
  // instant's frees come before its allocations.
  PIPETUNE_INLINE void start_ready(double now) {
    int starting = 0;
    while (startable_count > 0) {
      const int id = startable[--startable_count];
      double end = 0.0;
      if (!starts_now(id, now, end)) continue;
      start[id] = now;
      finish[id] = end;
      if (tasks[id].duration == 0.0 && end == now) {
        run_at_once(id, now);
      } else {
        batch[starting++] = id;
      }
    }
    for (int k = 0; k < starting; ++k) begin(batch[k], now);
  }

  // Every completion and transient at the earliest instant: frees first, then releases, then
  // the tasks that can start.
  PIPETUNE_INLINE void next_instant() {
    const auto now_key = static_cast<std::uint64_t>(heap[0] >> 64);
    const double now = key_time(now_key);
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
        engine.change(tasks[task].start_counter,
                      is_late ? -late[task].bytes : -tasks[task].mid_bytes, now);
        continue;
      }
      const Task& t = tasks[id];
      if (t.end_bytes != 0) engine.change(t.end_counter, -t.end_bytes, now);
      batch[count++] = id;
    }
    for (int k = 0; k < count; ++k) release(batch[k]);
    engine.makespan_ = now;
    start_ready(now);
  }
};

void EventEngine::run_by_events() {
  prepare_event_run();
  EventRun run(*this);
  run.start_resource_heads();
  run.start_ready(0.0);
  while (run.heap_size > 0) run.next_instant();
  if (run.finished != run.n) throw_where_stuck();
}

// Every task that started has finished: a resource's first task that never started is where
// the run stuck.
void EventEngine::throw_where_stuck() const {
  for (std::size_t r = 0; r < resources_.size(); ++r) {
    for (int k = resources_[r].first; k < resources_[r].first + resources_[r].count; ++k) {
      if (start_[queue_[k]] != -1.0) continue;  // it started (every task starts at -1)
      throw std::logic_error("event engine: resource " + std::to_string(r) + " is stuck at task " +
                             std::to_string(queue_[k]) + " (the programme has a cycle)");
    }
  }
  throw std::logic_error("event engine: not every task ran");
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

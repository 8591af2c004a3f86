#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <torch/autograd.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <unordered_set>

#include "executor/device_runtime.hpp"
#include "executor/executor.hpp"
#include "executor/models/gradient_flow.hpp"
#include "executor/models/layers.hpp"
#include "executor/models/shared_tensors.hpp"
#include "executor/models/torch_reason.hpp"
#include "executor/placement.hpp"
#include "executor/rank_merge.hpp"
#include "executor/sm_partitions.hpp"
#include "executor/stage_backward.hpp"
#include "executor/tied_copies.hpp"
#include "executor/transport.hpp"
#include "sim/error.hpp"
#include "sim/schedule.hpp"
#include "sim/task_graph.hpp"
#include "sim/trace.hpp"

namespace pipetune::exec {

ExecutorError::ExecutorError(int stage_, int micro_batch_, const std::string& action,
                             const std::string& what)
    : WorkError(
          fmt::format("stage {}, micro-batch {} ({}): {}", stage_, micro_batch_, action, what)),
      stage(stage_),
      micro_batch(micro_batch_) {}

namespace {

// Threads carry the executor's names ("pt-compute-1"), so debuggers, top -H and tests tell them
// from the threads LibTorch and CUDA start for themselves. Linux keeps 15 characters.
void name_this_thread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

using Clock = std::chrono::steady_clock;

// The CPU time the calling thread has run, in ms. Beside a task's wall time it tells the task's
// work from the time its thread waited for a core.
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// A waiting thread re-checks for an abort or a stop this often: a signal handler cannot notify
// a condition variable, and a failed stage must not leave the others waiting forever.
constexpr auto kPoll = std::chrono::milliseconds(20);

// Thrown inside workers when another worker failed or a stop was requested.
struct Aborted {};

enum class Carry : std::uint8_t { Activation, Gradient };

struct Key {
  Carry carry;
  int stage;  // the stage that receives
  int micro_batch;
  bool operator<(const Key& o) const {
    return std::tie(carry, stage, micro_batch) < std::tie(o.carry, o.stage, o.micro_batch);
  }
};

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The stage that produced what `key` carries: activations come from the stage before, gradients
// from the stage after.
int sender_stage(const Key& key) {
  return key.carry == Carry::Activation ? key.stage - 1 : key.stage + 1;
}

// The copy that carries `key` from the stage that produced it to the one that receives it; the
// caller sets its times.
TraceTask copy_task(const Key& key, int from_device, int to_device, int step, std::int64_t bytes) {
  const bool activation = key.carry == Carry::Activation;
  TraceTask t;
  t.kind = activation ? TaskKind::SendActivation : TaskKind::SendGradient;
  t.stage = sender_stage(key);
  t.micro_batch = key.micro_batch;
  t.device = from_device;
  t.peer = to_device;
  t.step = step;
  t.bytes = bytes;
  return t;
}

// CUDA streams when the stages are on GPUs; else worker threads with an equal share of the
// cores (a rank runs one device of its own; worker threads in one process share the cores).
std::unique_ptr<DeviceRuntime> make_runtime(const StagePlacement& placement,
                                            const ExecutorOptions& options) {
  if (placement.cuda && options.sm_partitions > 0) {
    const SmPartitions& shares = sm_partitions(0, options.sm_partitions);
    std::vector<c10::Device> devices;
    std::vector<c10::Stream> streams;
    for (const DeviceName& d : placement.devices) {  // place_stages checked d.index < shares
      devices.emplace_back(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(0));
      streams.push_back(shares.streams[static_cast<std::size_t>(d.index)]);
    }
    return make_cuda_runtime(devices, options.record_memory_history, streams);
  }
  if (options.sm_partitions > 0) throw InputError(Input::Device, "SM partitions need CUDA devices");
  if (placement.cuda) {
    // A distributed run's ranks may outnumber the GPUs here: its device cuda:k runs on GPU
    // k mod the GPUs (ranks sharing a GPU, each with its own allocator). The other ranks'
    // devices, which this process never computes on, are put on the same GPU, so that it
    // opens no context on GPUs it does not use.
    const int rank_gpu =
        options.transport
            ? placement.devices[static_cast<std::size_t>(options.transport->rank())].index %
                  std::max(1, cuda_device_count())
            : -1;
    std::vector<c10::Device> devices;
    for (const DeviceName& d : placement.devices) {
      devices.emplace_back(c10::DeviceType::CUDA,
                           static_cast<c10::DeviceIndex>(rank_gpu >= 0 ? rank_gpu : d.index));
    }
    return make_cuda_runtime(devices, options.record_memory_history, {});
  }
  const int devices = static_cast<int>(placement.device_names.size());
  const int threads =
      resolved_cpu_threads(options.threads_per_cpu_device, options.transport ? 1 : devices);
  return make_cpu_runtime(devices, threads, options.record_memory_history);
}

// Stage s holds the next balance[s] of the model's children (the modules themselves, shared).
std::vector<torch::nn::Sequential> split_model(models::Model& model,
                                               const std::vector<int>& balance) {
  std::vector<torch::nn::Sequential> stages;
  auto layer = model.layers->begin();
  std::size_t layer_index = 0;
  for (int layers : balance) {
    torch::nn::Sequential stage;
    for (int k = 0; k < layers; ++k, ++layer, ++layer_index) {
      stage->push_back(model.layer_names[layer_index], *layer);
    }
    stage->train();
    stages.push_back(stage);
  }
  return stages;
}

// A module's buffers as they are now, to put back after a forward that must not count: a
// training-mode forward updates batch norm's running statistics (and its count of batches), and
// a recompute or a probe runs a micro-batch's forward a second time.
class KeptBuffers {
 public:
  explicit KeptBuffers(const torch::nn::Module& module) {
    for (const at::Tensor& b : module.buffers()) {
      if (b.defined()) kept_.emplace_back(b, b.clone());
    }
  }
  // Below autograd's in-place bookkeeping: a recompute's graph saved the buffers (batch norm's
  // backward takes the running statistics, though in training mode it reads the batch's), and a
  // version bump would fail that backward. The values it then holds are the ones it held before
  // this recompute, as on one device.
  void restore() {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (auto& [buffer, saved] : kept_) buffer.copy_(saved);
  }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> kept_;
};

}  // namespace

struct Pipeline::Impl {
  // --- fixed at construction ---
  models::Model& model;
  const Plan plan;
  const std::int64_t batch_size;
  const ExecutorOptions options;
  const StagePlacement placement;
  const int stage_count, micro_batches;
  const int local;  // the device this process runs (distributed), -1: all of them
  std::unique_ptr<DeviceRuntime> runtime;
  std::vector<torch::nn::Sequential> stages;
  const Schedule& schedule;                         // placement's
  const std::vector<std::vector<Action>> programs;  // per device
  const std::vector<char> recomputed;  // stage * micro_batches + micro_batch: has an R action
  const std::vector<char> split;       // stage * micro_batches + micro_batch: has an I action
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;  // per stage (local ones)
  std::unique_ptr<TiedCopies> tied;  // tied parameters several stages hold
  int tie_devices = 0;               // local devices holding a stage that waits for the sum
  // Per stage: its layers modify its input in place (1), not (0), not yet known (-1); read and
  // written by the stage's own worker only.
  std::vector<std::int8_t> modifies_input = std::vector<std::int8_t>(stage_count, -1);
  std::vector<std::size_t> first_layer;  // per stage: its first layer's index in the model
  // Per stage: whether its input needs a gradient (models::inputs_wanting_gradients). A frozen
  // stem's stages build no graph and send no gradient back.
  std::vector<char> input_wants_gradient;

  // --- threads ---
  std::vector<std::thread> workers;
  struct Channel {
    int from, to;
    std::thread thread;
    std::deque<std::pair<Key, Handoff>> queue;
    bool copying = false;            // a copy taken off the queue still holds the sender's tensor
    std::condition_variable queued;  // its thread waits here for the queue (or shutdown)
    std::vector<std::pair<TraceTask, std::pair<Stamp, Stamp>>> done;  // this step's copies
  };
  std::map<std::pair<int, int>, std::unique_ptr<Channel>> channels;
  // Distributed: what this device receives from another rank, in the order its programme
  // needs it, and the copies that brought it this step.
  struct Receiver {
    int peer;
    std::vector<Key> expected;
    std::thread thread;
    // Each copy received, its end a stamp on this device resolved once the step is over (a
    // GPU's event is not done when recorded).
    std::vector<std::pair<TraceTask, Stamp>> done;
  };
  std::vector<std::unique_ptr<Receiver>> receivers;
  double origin_clock_ms = 0.0;  // rank 0's clock at this step's begin_step
  std::mutex mutex;              // guards everything below and the channels' queues
  // Each waiter waits on a variable of its own, so that an event wakes only the thread it
  // concerns: with one variable for all, every copy woke every thread (about 8,500 context
  // switches a second on a two-stage-per-device plan of 25 ms steps on 2 vCPUs, each taking a
  // core from a computing worker). `wake`: a step's start and end, the tied sum; `mail[d]`:
  // device d's worker waiting for a tensor (take); `copied`: a copy done (a worker waiting for
  // its sends to let go); a channel's own `queued`. wake_everyone() for a failure or shutdown.
  std::condition_variable wake;
  std::vector<std::unique_ptr<std::condition_variable>> mail;
  std::condition_variable copied;
  std::uint64_t generation = 0;
  int workers_running = 0;
  bool shutting_down = false;
  // This step's sum of the tied parameters' gradients: each device's part, the total per tie.
  std::map<int, std::vector<at::Tensor>> tie_parts;
  std::vector<at::Tensor> tie_totals;
  bool tie_summed = false;

  // --- per step ---
  int step_index = 0;
  std::vector<at::Tensor> micro_inputs, micro_targets;
  std::map<Key, Handoff> mailbox;
  std::vector<MicroBatchState> contexts;    // stage * micro_batches + micro_batch
  std::vector<at::Tensor> losses;           // per micro-batch, scaled
  std::vector<std::vector<TraceTask>> ran;  // per device
  std::vector<std::vector<Stamp>> stamps;   // per device: start, end of each task
  std::atomic<bool> abort{false};
  std::atomic<bool> stop{false};
  bool broken = false;
  std::unique_ptr<ExecutorError> error;

  Impl(models::Model& m, const Plan& p, std::int64_t batch, ExecutorOptions o)
      : model(m),
        plan(p),
        batch_size(batch),
        options(std::move(o)),
        placement(
            place_stages(plan, static_cast<int>(model.layer_names.size()), model.name, batch_size,
                         options.devices, options.transport ? options.transport->world_size() : 0,
                         options.schedule ? &*options.schedule : nullptr, options.sm_partitions)),
        stage_count(plan.stages()),
        micro_batches(static_cast<int>(placement.micro_batch_sizes.size())),
        local(options.transport ? options.transport->rank() : -1),
        runtime(make_runtime(placement, options)),
        stages(split_model(model, plan.balance)),
        schedule(placement.schedule),
        programs(device_programs(schedule, placement.device_of, device_count())),
        recomputed(micro_batches_with(schedule, ActionKind::Recompute)),
        split(micro_batches_with(schedule, ActionKind::InputGrad)) {
    // An earlier pipeline over the same model may have left gradients, charged where its stages
    // were: gone before the count starts, or their release would count against this plan.
    drop_gradients();
    tied = std::make_unique<TiedCopies>(model, plan.balance,
                                        [this](int s) { return is_local(device_of(s)); });
    std::set<int> meeting;
    for (int s = 0; s < stage_count; ++s) {
      if (is_local(device_of(s)) && tied->waits_for_sum(s)) meeting.insert(device_of(s));
    }
    tie_devices = static_cast<int>(meeting.size());
    std::size_t layer = 0;
    for (int layers : plan.balance) {
      first_layer.push_back(layer);
      layer += static_cast<std::size_t>(layers);
    }
    const std::vector<char> wants = models::inputs_wanting_gradients(model);
    for (std::size_t first : first_layer) input_wants_gradient.push_back(wants[first]);
    adopt_local_stages();
    optimizers = make_optimizers();
    runtime->count_from(held_bytes());
  }

  int device_count() const { return static_cast<int>(placement.device_names.size()); }
  int device_of(int stage) const { return placement.device_of[stage]; }
  MicroBatchState& context(int s, int i) {
    return contexts[static_cast<std::size_t>(s) * micro_batches + i];
  }
  std::optional<Key> receives(const Action& a) const;

  void adopt_local_stages();
  std::vector<std::unique_ptr<torch::optim::Optimizer>> make_optimizers();
  void start_threads();
  void worker_main(int device);
  void channel_main(Channel* channel);
  void receiver_main(Receiver* receiver);
  bool next_step(std::uint64_t& seen);
  void step_done();
  void wait_for_outgoing_copies(int device);
  void sum_tied_gradients(int device);
  void combine_tied_parts();
  void across_ranks(std::size_t tie, at::Tensor& total);
  bool is_local(int device) const { return local < 0 || device == local; }
  int tag(const Key& key) const {
    return (key.stage * 2 + static_cast<int>(key.carry)) * micro_batches + key.micro_batch;
  }
  void drop_gradients();
  std::vector<std::int64_t> held_bytes();
  void run_action(int device, const Action& a, at::Generator& generator, Handoff incoming);
  void send(Carry carry, int to_stage, int micro_batch, const at::Tensor& tensor, int from_device);
  Handoff take(const Key& key);
  void fail(const Action& a, const std::string& what);
  // Under `mutex`: a tensor for `key` is in the mailbox; wake the worker that takes it.
  void deliver(const Key& key, Handoff handoff) {
    mailbox[key] = std::move(handoff);
    mail[static_cast<std::size_t>(device_of(key.stage))]->notify_all();
  }
  void wake_everyone() {
    wake.notify_all();
    copied.notify_all();
    for (auto& m : mail) m->notify_all();
    for (auto& [link, c] : channels) c->queued.notify_all();
  }
  bool stage_modifies_input(int stage, const at::Tensor& input);

  // One step, in the order Pipeline::step runs them.
  void check_batch(const at::Tensor& input, const at::Tensor& target) const;
  void scatter(const at::Tensor& input, const at::Tensor& target);
  template <typename Work>
  auto between_ranks(const Work& work);
  void run_programmes();
  void throw_if_failed();
  StepRecord record(double step_ms);
  StepRecord merge_ranks(const StepRecord& mine);
};

// Parameters and buffers become the device's own (moved to it, charged to it); another
// process's stages stay as built, unused here.
void Pipeline::Impl::adopt_local_stages() {
  at::NoGradGuard no_grad;
  for (int s = 0; s < stage_count; ++s) {
    if (!is_local(device_of(s))) continue;
    for (auto& p : stages[s]->parameters()) p.set_data(runtime->adopt(p.detach(), device_of(s)));
    for (auto& b : stages[s]->buffers()) b.set_data(runtime->adopt(b.detach(), device_of(s)));
  }
}

// Gradients start from nothing each step, as the memory model has it: the first backward
// allocates them. Dropped before the step's memory count starts, so the count never holds last
// step's gradients.
void Pipeline::Impl::drop_gradients() {
  for (int s = 0; s < stage_count; ++s) {
    if (!is_local(device_of(s))) continue;
    for (auto& p : stages[s]->parameters()) p.mutable_grad().reset();
  }
}

// What this pipeline's tensors take on each of its devices as a step starts: parameters,
// buffers, optimizer state, this step's micro-batches; each storage once, in the allocator's
// block sizes. The rest of what the device gained since the pipeline was built is the
// libraries' (StepRecord::library_memory_bytes).
std::vector<std::int64_t> Pipeline::Impl::held_bytes() {
  std::vector<std::int64_t> bytes(static_cast<std::size_t>(device_count()), 0);
  std::set<const void*> seen;
  auto count = [&](const at::Tensor& t, int device) {
    if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) return;
    if (seen.insert(t.storage().data()).second) {
      bytes[device] += runtime->block_bytes(static_cast<std::int64_t>(t.storage().nbytes()));
    }
  };
  for (int s = 0; s < stage_count; ++s) {
    const int d = device_of(s);
    if (!is_local(d)) continue;
    for (const auto& p : stages[s]->parameters()) {
      count(p, d);
      count(p.grad(), d);
    }
    for (const auto& b : stages[s]->buffers()) count(b, d);
    if (optimizers[s]) {
      for (const auto& t : optimizer_state_tensors(*optimizers[s])) count(t, d);
    }
  }
  for (const auto& x : micro_inputs) count(x, device_of(0));
  for (const auto& y : micro_targets) count(y, device_of(stage_count - 1));
  return bytes;
}

// One optimizer per stage this process runs, over the stage's parameters, each once: a tensor
// two layers of the stage hold (tied weights) is listed under both names, and listed twice it
// would be stepped twice.
std::vector<std::unique_ptr<torch::optim::Optimizer>> Pipeline::Impl::make_optimizers() {
  std::vector<std::unique_ptr<torch::optim::Optimizer>> out(stage_count);
  for (int s = 0; s < stage_count; ++s) {
    if (!is_local(device_of(s))) continue;
    std::vector<at::Tensor> parameters;
    std::unordered_set<const void*> seen;
    for (const auto& p : stages[s]->parameters()) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) parameters.push_back(p);
    }
    out[s] = make_optimizer(options.optimizer, std::move(parameters), options.learning_rate);
  }
  return out;
}

// What an action waits for from another stage: the forward its input activation, the backward
// (B or I) its output's gradient.
std::optional<Key> Pipeline::Impl::receives(const Action& a) const {
  switch (a.kind) {
    case ActionKind::Forward:
      if (a.stage > 0) return Key{Carry::Activation, a.stage, a.micro_batch};
      return std::nullopt;
    case ActionKind::Backward:
    case ActionKind::InputGrad:
      if (a.stage + 1 < stage_count) return Key{Carry::Gradient, a.stage, a.micro_batch};
      return std::nullopt;
    case ActionKind::Recompute:
    case ActionKind::WeightGrad:
      return std::nullopt;
  }
  return std::nullopt;
}

void Pipeline::Impl::start_threads() {
  const int devices = device_count();
  ran.resize(devices);
  stamps.resize(devices);
  for (int d = 0; d < devices; ++d) mail.push_back(std::make_unique<std::condition_variable>());
  for (int d = 0; d < devices; ++d) {
    if (is_local(d)) workers.emplace_back([this, d] { worker_main(d); });
  }
  if (options.transport) {
    // A receiver per peer that sends here, expecting in this device's programme order.
    std::map<int, Receiver*> by_peer;
    for (const Action& a : programs[local]) {
      const std::optional<Key> key = receives(a);
      if (!key) continue;
      const int from = device_of(sender_stage(*key));
      if (from == local) continue;
      Receiver*& r = by_peer[from];
      if (!r) {
        receivers.push_back(std::make_unique<Receiver>());
        r = receivers.back().get();
        r->peer = from;
      }
      r->expected.push_back(*key);
    }
    for (auto& r : receivers) {
      Receiver* receiver = r.get();
      receiver->thread = std::thread([this, receiver] { receiver_main(receiver); });
    }
    return;
  }
  // One copy channel per direction between devices that exchange data.
  for (int s = 0; s + 1 < stage_count; ++s) {
    const int a = device_of(s), b = device_of(s + 1);
    if (a == b) continue;
    for (auto [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
      auto& c = channels[{from, to}];
      if (c) continue;
      c = std::make_unique<Channel>();
      c->from = from;
      c->to = to;
    }
  }
  for (auto& [key, c] : channels) {
    Channel* channel = c.get();
    channel->thread = std::thread([this, channel] { channel_main(channel); });
  }
}

void Pipeline::Impl::fail(const Action& a, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!error) error = std::make_unique<ExecutorError>(a.stage, a.micro_batch, to_string(a), what);
  abort = true;
  wake_everyone();
}

Handoff Pipeline::Impl::take(const Key& key) {
  std::unique_lock<std::mutex> lock(mutex);
  for (;;) {
    if (abort || stop) throw Aborted{};
    auto it = mailbox.find(key);
    if (it != mailbox.end()) {
      Handoff h = std::move(it->second);
      mailbox.erase(it);
      return h;
    }
    mail[static_cast<std::size_t>(device_of(key.stage))]->wait_for(lock, kPoll);
  }
}

void Pipeline::Impl::send(Carry carry, int to_stage, int micro_batch, const at::Tensor& tensor,
                          int from_device) {
  const int to_device = device_of(to_stage);
  if (!is_local(to_device)) {
    // Another process: the receiver there records the copy, from the time sent along with it.
    const Key key{carry, to_stage, micro_batch};
    try {
      // In host memory first (a GPU's tensor once its kernels are done), then timed as sent.
      const at::Tensor outgoing = runtime->depart(tensor, from_device);
      options.transport->send(outgoing, to_device, tag(key), options.transport->clock_ms());
    } catch (const std::exception& e) {
      // A peer that died may be noticed here first, by a send, before any receive: name both.
      throw WorkError(fmt::format(
          "step {}: sending the {} of stage {} to rank {}: {}", step_index + 1,
          carry == Carry::Activation ? "activation" : "gradient", to_stage, to_device, e.what()));
    }
    return;
  }
  Handoff h = runtime->publish(tensor, from_device);
  std::lock_guard<std::mutex> lock(mutex);
  const Key key{carry, to_stage, micro_batch};
  if (to_device == from_device) {
    deliver(key, std::move(h));  // same device: the tensor itself
  } else {
    Channel& c = *channels.at({from_device, to_device});
    c.queue.emplace_back(key, std::move(h));
    c.queued.notify_one();
  }
}

void Pipeline::Impl::channel_main(Channel* c) {
  name_this_thread(fmt::format("pt-copy-{}-{}", c->from, c->to));
  runtime->bind_copy_thread(c->from, c->to);
  std::unique_lock<std::mutex> lock(mutex);
  for (;;) {
    while (c->queue.empty() && !shutting_down) c->queued.wait_for(lock, kPoll);
    if (shutting_down) return;
    auto [key, handoff] = std::move(c->queue.front());
    c->queue.pop_front();
    if (abort) continue;  // a stage failed: drop what is in flight
    c->copying = true;
    lock.unlock();
    Handoff moved;
    Stamp begin, end;
    try {
      begin = runtime->now(c->to);
      moved = runtime->copy(handoff, c->from, c->to);
      end = runtime->now(c->to);
    } catch (const std::exception& e) {
      const int sender = sender_stage(key);
      fail(Action{key.carry == Carry::Activation ? ActionKind::Forward : ActionKind::Backward,
                  sender, key.micro_batch},
           fmt::format("copy to {}: {}", placement.device_names[c->to], e.what()));
      handoff = {};
      lock.lock();
      c->copying = false;
      copied.notify_all();
      continue;
    }
    const TraceTask t = copy_task(key, c->from, c->to, step_index,
                                  static_cast<std::int64_t>(handoff.tensor.nbytes()));
    handoff = {};  // the sender's buffer may go now (CUDA: after the copy, by record_stream)
    lock.lock();
    c->copying = false;
    c->done.push_back({t, {begin, end}});
    deliver(key, std::move(moved));
    copied.notify_all();
  }
}

// A worker's or receiver's wait for the next step; false when the pipeline shuts down.
bool Pipeline::Impl::next_step(std::uint64_t& seen) {
  std::unique_lock<std::mutex> lock(mutex);
  while (generation == seen && !shutting_down) wake.wait_for(lock, kPoll);
  seen = generation;
  return !shutting_down;
}

// Until every copy out of `device` (same process) has let go of the sender's tensor; a failed
// or stopped step does not wait.
void Pipeline::Impl::wait_for_outgoing_copies(int device) {
  std::unique_lock<std::mutex> lock(mutex);
  auto pending = [&] {
    for (const auto& [link, c] : channels) {
      if (link.first == device && (c->copying || !c->queue.empty())) return true;
    }
    return false;
  };
  while (pending() && !abort && !stop && !shutting_down) copied.wait_for(lock, kPoll);
}

// Every device holding a tied parameter's copy brings its part of the gradient (summed on its
// own thread, in host memory once its kernels are done); the last to come adds the parts in
// device order and across ranks; then each device gives its copies the total, on its own
// thread again. So no thread touches another device's tensors while its kernels may run.
void Pipeline::Impl::sum_tied_gradients(int d) {
  auto on_device = [&](int s) { return device_of(s) == d; };
  std::vector<at::Tensor> parts;
  for (std::size_t t = 0; t < tied->ties().size(); ++t) {
    const at::Tensor part = tied->sum_of(t, on_device);
    parts.push_back(part.defined() ? runtime->depart(part, d) : part);
  }
  std::unique_lock<std::mutex> lock(mutex);
  tie_parts[d] = std::move(parts);
  if (static_cast<int>(tie_parts.size()) == tie_devices) {
    lock.unlock();
    combine_tied_parts();
    lock.lock();
    tie_summed = true;
    wake.notify_all();
  }
  while (!tie_summed) {
    if (abort || stop) throw Aborted{};
    wake.wait_for(lock, kPoll);
  }
  lock.unlock();
  for (std::size_t t = 0; t < tie_totals.size(); ++t) {
    if (tie_totals[t].defined()) tied->set_gradients(t, tie_totals[t], on_device);
  }
}

void Pipeline::Impl::combine_tied_parts() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> totals;
  for (std::size_t t = 0; t < tied->ties().size(); ++t) {
    const TiedStages& tie = tied->ties()[t];
    at::Tensor total;
    // Device order: every copy gets the same sum.
    for (auto& [device, parts] : tie_parts) accumulate_into(total, parts[t]);
    if (!tie.tensors.empty()) {
      if (!total.defined()) total = at::zeros_like(tie.tensors.front(), at::kCPU);
      across_ranks(t, total);
    }
    totals.push_back(total);
  }
  tie_totals = std::move(totals);
}

// The ranks holding a tie send their sums to the first of them, which adds them in rank order
// and sends the total back. Tags after the activations' and gradients' ones.
void Pipeline::Impl::across_ranks(std::size_t tie, at::Tensor& total) {
  Transport* transport = options.transport.get();
  if (!transport) return;
  std::set<int> ranks;
  for (int s : tied->ties()[tie].stages) ranks.insert(device_of(s));
  if (ranks.size() < 2) return;
  const int up = 2 * stage_count * micro_batches + 2 * static_cast<int>(tie), down = up + 1;
  const int owner = *ranks.begin();
  if (local != owner) {
    transport->send(total, owner, up, transport->clock_ms());
    total = transport->recv(owner, down).tensor;
    return;
  }
  for (int r : ranks) {
    if (r != owner) total.add_(transport->recv(r, up).tensor);
  }
  for (int r : ranks) {
    if (r != owner) transport->send(total, r, down, transport->clock_ms());
  }
}

void Pipeline::Impl::step_done() {
  std::lock_guard<std::mutex> lock(mutex);
  --workers_running;
  wake.notify_all();
}

void Pipeline::Impl::receiver_main(Receiver* r) {
  name_this_thread(fmt::format("pt-recv-{}", r->peer));
  runtime->bind_copy_thread(r->peer, local);
  std::uint64_t seen = 0;
  while (next_step(seen)) {
    for (const Key& key : r->expected) {
      if (abort || stop) break;
      const bool activation = key.carry == Carry::Activation;
      const int sender = sender_stage(key);
      try {
        Received got = options.transport->recv(r->peer, tag(key));
        // Onto this rank's device (a GPU's copy from host memory ends the transfer).
        Handoff arrived_tensor = runtime->arrive(got.tensor, local);
        const Stamp arrived = runtime->now(local);
        TraceTask t = copy_task(key, r->peer, local, step_index,
                                static_cast<std::int64_t>(got.tensor.nbytes()));
        t.start_ms = got.sent_ms - origin_clock_ms;  // the sender's clock, as rank 0 reads it
        std::lock_guard<std::mutex> lock(mutex);
        r->done.emplace_back(t, arrived);
        deliver(key, std::move(arrived_tensor));
      } catch (const std::exception& e) {
        if (abort || stop) break;  // cancelled: this step failed or stopped here already
        fail(Action{activation ? ActionKind::Forward : ActionKind::Backward, key.stage,
                    key.micro_batch},
             fmt::format("step {}: waiting for the {} of stage {} from rank {}: {}", step_index + 1,
                         activation ? "activation" : "gradient", sender, r->peer, e.what()));
        break;
      }
    }
    step_done();
  }
}

// A stage whose layers modify its input in place (torchvision's ReLU(inplace=True) after a split,
// or an in-place dropout after a Flatten's view of it) cannot run on its input: autograd refuses
// an in-place change to the leaf that collects the input's gradient (or to a view of it), and a
// checkpointed forward, without autograd, would change the input kept for its recompute. Such a
// stage's layers run on a copy. Found once per stage, at its first forward: the layers run on a
// copy of the input for as long as their outputs alias it, and the copy's version counter counts
// any in-place change. In training mode, since dropout changes its input only there; without
// autograd; their buffers (batch norm's running statistics) put back after, deferred batch norm
// counting nothing (as in a recompute), and their draws made again by the forward that follows
// (a layer entered again reseeds).
bool Pipeline::Impl::stage_modifies_input(int s, const at::Tensor& x) {
  std::int8_t& known = modifies_input[static_cast<std::size_t>(s)];
  if (known >= 0) return known == 1;
  known = 0;
  const at::Tensor probe = x.detach().clone();
  const auto version = probe._version();
  at::NoGradGuard no_grad;
  models::ScopedRecompute not_counted;
  at::Tensor h = probe;
  std::size_t layer = first_layer[static_cast<std::size_t>(s)];
  for (auto& module : *stages[s]) {
    KeptBuffers buffers(*module.ptr());
    models::ScopedGenerator::enter_layer(layer++);
    h = module.forward<at::Tensor>(h);
    buffers.restore();
    if (probe._version() != version) {
      known = 1;
      break;
    }
    // A later layer reaches the input only through an output that shares its storage.
    if (!h.defined() || !h.has_storage() || !h.storage().is_alias_of(probe.storage())) break;
  }
  return known == 1;
}

void Pipeline::Impl::run_action(int d, const Action& a, at::Generator& generator,
                                Handoff incoming) {
  const int s = a.stage, i = a.micro_batch;
  const bool last = s + 1 == stage_count;
  MicroBatchState& ctx = context(s, i);
  // One seed per (step, micro-batch), each layer's draws seeded from it and the layer's index in
  // the model: a recompute draws its forward's masks, and no split changes any layer's.
  models::ScopedGenerator use(&generator,
                              mix(options.seed ^ mix(static_cast<std::uint64_t>(step_index) << 32 ^
                                                     static_cast<std::uint64_t>(i))));
  const std::size_t first = first_layer[static_cast<std::size_t>(s)];
  const double scale =
      static_cast<double>(placement.micro_batch_sizes[i]) / static_cast<double>(batch_size);

  switch (a.kind) {
    case ActionKind::Forward: {
      at::Tensor x = s == 0 ? micro_inputs[i] : runtime->consume(incoming, d);
      if (input_wants_gradient[s] && at::isFloatingType(x.scalar_type())) x.requires_grad_(true);
      ctx.input = x;
      ctx.copy_input = stage_modifies_input(s, x);
      at::Tensor y;
      if (recomputed[static_cast<std::size_t>(s) * micro_batches + i]) {
        at::NoGradGuard no_grad;  // keep only the input; the recompute rebuilds the graph
        y = forward_stage(stages[s], first, layers_input(ctx));
        if (last) losses[i] = model.loss(y, micro_targets[i]).detach() * scale;
      } else {
        // A split backward needs each layer's output; B needs only the stage's.
        y = split[static_cast<std::size_t>(s) * micro_batches + i]
                ? forward_layers(stages[s], ctx, first)
                : forward_stage(stages[s], first, layers_input(ctx));
        if (last) {
          ctx.output = model.loss(y, micro_targets[i]) * scale;
          losses[i] = ctx.output.detach();
        } else {
          ctx.output = y;
        }
      }
      if (!last) send(Carry::Activation, s + 1, i, y.detach(), d);
      break;
    }
    case ActionKind::Recompute: {
      // The checkpointed forward counted this micro-batch in the running statistics already.
      models::ScopedRecompute recomputing;
      KeptBuffers buffers(*stages[s]);
      at::Tensor y = split[static_cast<std::size_t>(s) * micro_batches + i]
                         ? forward_layers(stages[s], ctx, first)
                         : forward_stage(stages[s], first, layers_input(ctx));
      buffers.restore();
      ctx.output = last ? model.loss(y, micro_targets[i]) * scale : y;
      break;
    }
    case ActionKind::Backward:
    case ActionKind::InputGrad: {
      // The last stage starts from its loss; the others from the next stage's gradient.
      const at::Tensor gradient = last ? at::Tensor() : runtime->consume(incoming, d);
      const at::TensorOptions input_options = ctx.input.options();
      const at::Tensor input_gradient = a.kind == ActionKind::Backward
                                            ? backward_whole(ctx, gradient)
                                            : backward_input(ctx, gradient);
      // Where no layer before trains, the previous stage waits all the same: it gets an empty
      // tensor, and its backward has no graph to run.
      if (s > 0)
        send(Carry::Gradient, s - 1, i,
             input_gradient.defined() ? input_gradient : at::empty({0}, input_options), d);
      break;
    }
    case ActionKind::WeightGrad:
      backward_weight(ctx, stages[s]);
      break;
  }
}

void Pipeline::Impl::worker_main(int d) {
  name_this_thread(fmt::format("pt-compute-{}", d));
  runtime->bind_compute_thread(d);
  const bool timed_cpu = runtime->thread_time_is_work(d);
  at::Generator generator = runtime->make_generator(d);
  std::uint64_t seen = 0;
  while (next_step(seen)) {
    Action current{};
    try {
      for (const Action& a : programs[d]) {
        if (abort || stop) throw Aborted{};
        current = a;
        // Wait for what the action needs from another stage first: a task's time is its own
        // work, and the wait is the dependency's (the simulator and replay count it there).
        // On a GPU the stream waits for the tensor here too, before the task's start is
        // stamped on it: a stamp before the wait would put the wait in the task.
        Handoff incoming;
        if (const std::optional<Key> key = receives(a)) {
          const Handoff taken = take(*key);
          incoming = Handoff{runtime->consume(taken, d), nullptr};
        }
        const Stamp begin = runtime->now(d);
        runtime->sample_memory(d, begin);
        const double cpu_begin = timed_cpu ? thread_cpu_ms() : 0.0;
        run_action(d, a, generator, std::move(incoming));
        const double cpu_end = timed_cpu ? thread_cpu_ms() : 0.0;
        const Stamp end = runtime->now(d);
        runtime->sample_memory(d, end);
        TraceTask t;
        t.kind = task_kind(a.kind);
        t.stage = a.stage;
        t.micro_batch = a.micro_batch;
        t.device = d;
        t.step = step_index;
        if (timed_cpu) t.cpu_ms = cpu_end - cpu_begin;
        ran[d].push_back(t);
        stamps[d].push_back(begin);
        stamps[d].push_back(end);
      }
      // Every backward of this device's stages is done: their parameters can step, once what
      // the device sent has been copied and let go, so that the step's transients never
      // overlap a gradient still held for its copy (the peak is then the same every step).
      wait_for_outgoing_copies(d);
      bool holds_tie = false;
      for (int s = 0; s < stage_count; ++s) {
        if (device_of(s) != d) continue;
        holds_tie = holds_tie || tied->waits_for_sum(s);
        if (optimizers[s] && !abort && !stop && !tied->waits_for_sum(s)) optimizers[s]->step();
      }
      if (holds_tie && !abort && !stop) {
        sum_tied_gradients(d);
        for (int s = 0; s < stage_count; ++s) {
          if (device_of(s) == d && optimizers[s] && tied->waits_for_sum(s)) optimizers[s]->step();
        }
      }
    } catch (const Aborted&) {
    } catch (const std::exception& e) {
      fail(current, models::torch_reason(e));
    }
    step_done();
  }
}

// What fails between the ranks names the step (counted from 1, warm-up included), and leaves
// the pipeline broken.
template <typename Work>
auto Pipeline::Impl::between_ranks(const Work& work) {
  try {
    return work();
  } catch (const WorkError& e) {
    broken = true;
    // Ctrl-C reaches every rank at about the same time: a peer that stopped first is no fault.
    if (stop) throw Interrupted();
    throw WorkError(fmt::format("step {}: {}", step_index + 1, e.what()));
  } catch (...) {
    broken = true;
    throw;
  }
}

namespace {

// A tensor stages share that cannot be kept as one: refused before any thread or tensor moves.
models::Model& with_tied_split_checked(models::Model& model, const Plan& plan) {
  models::check_tied_split(model, plan.balance, "plan");
  return model;
}

}  // namespace

Pipeline::Pipeline(models::Model& model, const Plan& plan, std::int64_t batch_size,
                   ExecutorOptions options)
    : impl_(std::make_unique<Impl>(with_tied_split_checked(model, plan), plan, batch_size,
                                   std::move(options))) {
  impl_->start_threads();
}

Pipeline::~Pipeline() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->shutting_down = true;
    impl_->abort = true;
    impl_->wake_everyone();
  }
  for (auto& t : impl_->workers) t.join();
  for (auto& [key, c] : impl_->channels) c->thread.join();
  for (auto& r : impl_->receivers) r->thread.join();
}

StepRecord Pipeline::step(const at::Tensor& input, const at::Tensor& target) {
  Impl& m = *impl_;
  if (m.broken)
    throw std::logic_error("the pipeline failed in an earlier step and cannot run again");
  m.check_batch(input, target);
  const auto started = Clock::now();
  m.scatter(input, target);
  Transport* transport = m.options.transport.get();
  if (transport) {
    if (m.stop) {
      m.broken = true;
      throw Interrupted();
    }
    m.between_ranks([&] { transport->barrier(fmt::format("step {}", m.step_index + 1)); });
  }
  m.drop_gradients();
  m.runtime->begin_step(m.held_bytes());
  if (transport) m.origin_clock_ms = transport->clock_ms();
  m.run_programmes();
  m.runtime->end_step();
  if (transport && !m.error && !m.stop) {
    // The peers have what this rank sent: their step is over too.
    m.between_ranks([&] { transport->flush_sends(); });
  }
  const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  m.throw_if_failed();

  StepRecord record = m.record(step_ms);
  if (transport) record = m.between_ranks([&] { return m.merge_ranks(record); });
  record.pipeline_ms = task_span(record.tasks).duration_ms();  // what the simulator predicts
  return record;
}

void Pipeline::Impl::check_batch(const at::Tensor& input, const at::Tensor& target) const {
  if (input.size(0) != batch_size || target.size(0) != batch_size) {
    throw InputError(fmt::format("batch: expected {} samples, got {} inputs and {} targets",
                                 batch_size, input.size(0), target.size(0)));
  }
}

// Micro-batches as tensor.chunk makes them, charged to the first (inputs) and the last
// (targets) stage's device; and this step's state, empty.
void Pipeline::Impl::scatter(const at::Tensor& input, const at::Tensor& target) {
  micro_inputs.clear();
  micro_targets.clear();
  const int first = device_of(0), last = device_of(stage_count - 1);
  if (is_local(first)) micro_inputs = runtime->adopt(input, first).chunk(plan.chunks);
  if (is_local(last)) micro_targets = runtime->adopt(target, last).chunk(plan.chunks);
  contexts.assign(static_cast<std::size_t>(stage_count) * micro_batches, {});
  losses.assign(micro_batches, {});
  for (auto& r : ran) r.clear();
  for (auto& s : stamps) s.clear();
  for (auto& [key, c] : channels) c->done.clear();
  for (auto& r : receivers) r->done.clear();
  mailbox.clear();
  tie_parts.clear();
  tie_totals.clear();
  tie_summed = false;
}

// Wakes the workers and receivers for this step and waits until every one is done.
void Pipeline::Impl::run_programmes() {
  Transport* transport = options.transport.get();
  std::unique_lock<std::mutex> lock(mutex);
  workers_running = static_cast<int>(workers.size() + receivers.size());
  ++generation;
  wake.notify_all();
  bool cancelled = false;
  while (workers_running > 0) {
    wake.wait_for(lock, kPoll);
    // A receiver blocked on a peer must not hold up a step that failed or stopped here (the
    // signal handler cannot do this itself: it may only set the flag).
    if (transport && (abort || stop) && !cancelled) {
      cancelled = true;
      lock.unlock();
      transport->cancel_receives();
      lock.lock();
    }
  }
}

// Drops the step's tensors; a failed or stopped step leaves the pipeline broken.
void Pipeline::Impl::throw_if_failed() {
  micro_inputs.clear();
  micro_targets.clear();
  contexts.clear();
  if (error) {
    broken = true;
    throw *error;
  }
  if (stop) {
    broken = true;
    throw Interrupted();
  }
  for (int s = 0; s < stage_count; ++s) {
    if (is_local(device_of(s))) models::commit_deferred_batch_norms(*stages[s]);
  }
}

// What this process measured: its tasks on one time base, the loss, the memory.
StepRecord Pipeline::Impl::record(double step_ms) {
  StepRecord out;
  out.step = step_index++;
  out.step_ms = step_ms;
  for (const auto& l : losses) {
    if (l.defined()) out.loss += l.item<double>();  // only the last stage's process has them
  }
  for (std::size_t d = 0; d < ran.size(); ++d) {
    for (std::size_t k = 0; k < ran[d].size(); ++k) {
      TraceTask t = ran[d][k];
      t.start_ms = runtime->resolve(stamps[d][2 * k]);
      t.end_ms = runtime->resolve(stamps[d][2 * k + 1]);
      out.tasks.push_back(t);
    }
  }
  for (auto& [key, c] : channels) {
    for (auto& [task, span] : c->done) {
      TraceTask t = task;
      t.start_ms = runtime->resolve(span.first);
      t.end_ms = runtime->resolve(span.second);
      out.tasks.push_back(t);
    }
  }
  for (auto& r : receivers) {
    for (auto& [task, arrived] : r->done) {
      TraceTask t = task;
      t.end_ms = runtime->resolve(arrived);
      out.tasks.push_back(t);
    }
  }
  for (int d = 0; d < device_count(); ++d) {
    out.peak_memory_bytes.push_back(runtime->peak(d));
    out.library_memory_bytes.push_back(runtime->library_bytes(d));
  }
  if (options.record_memory_history) out.memory = runtime->memory_history();
  return out;
}

// Every rank sends rank 0 its part of the step (executor/rank_merge.hpp); rank 0 puts the
// parts on its own clock, the others keep their own part.
StepRecord Pipeline::Impl::merge_ranks(const StepRecord& mine) {
  const std::vector<std::string> messages =
      options.transport->gather(fmt::format("step {}", mine.step + 1),
                                encode_rank_part(rank_part(mine, local, origin_clock_ms)));
  if (messages.empty()) return mine;  // not rank 0
  std::vector<RankPart> parts;
  for (std::size_t r = 0; r < messages.size(); ++r) {
    parts.push_back(decode_rank_part(messages[r], static_cast<int>(r)));
  }
  return merge_rank_parts(parts, mine.step, origin_clock_ms, options.record_memory_history);
}

void Pipeline::request_stop() {
  impl_->stop = true;
}
const std::vector<std::string>& Pipeline::device_names() const {
  return impl_->placement.device_names;
}
const std::vector<int>& Pipeline::stage_device() const {
  return impl_->placement.device_of;
}
std::vector<torch::nn::Sequential>& Pipeline::stages() {
  return impl_->stages;
}
const Plan& Pipeline::plan() const {
  return impl_->plan;
}
const std::vector<std::int64_t>& Pipeline::micro_batch_sizes() const {
  return impl_->placement.micro_batch_sizes;
}

}  // namespace pipetune::exec

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/autograd.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <pthread.h>
#include <thread>

#include "executor/device_runtime.hpp"
#include "executor/executor.hpp"
#include "executor/models/layers.hpp"
#include "executor/placement.hpp"
#include "executor/transport.hpp"
#include "sim/error.hpp"
#include "sim/schedule.hpp"

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

// First task's start to last task's end: what the simulator predicts as the iteration.
double pipeline_ms(const std::vector<TraceTask>& tasks) {
  if (tasks.empty()) return 0.0;
  double first = tasks.front().start_ms, last = tasks.front().end_ms;
  for (const auto& t : tasks) {
    first = std::min(first, t.start_ms);
    last = std::max(last, t.end_ms);
  }
  return last - first;
}

// Parses "cpu:3" / "cuda:1".
std::pair<c10::DeviceType, int> parse_device(const std::string& name) {
  const auto colon = name.find(':');
  const std::string type = name.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    const std::string digits = name.substr(colon + 1);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
      throw InputError(fmt::format("device \"{}\": expected cpu:<n> or cuda:<n>", name));
    }
    index = std::stoi(digits);
  }
  if (type == "cpu") return {c10::DeviceType::CPU, index};
  if (type == "cuda") return {c10::DeviceType::CUDA, index};
  throw InputError(fmt::format("device \"{}\": expected cpu:<n> or cuda:<n>", name));
}

}  // namespace

struct Pipeline::Impl {
  // --- fixed at construction ---
  models::Model& model;
  Plan plan;
  std::int64_t batch_size;
  ExecutorOptions options;
  std::vector<std::int64_t> sizes;
  int stage_count = 0, micro_batches = 0;
  std::vector<torch::nn::Sequential> stages;
  std::vector<std::string> device_names;  // devices that hold stages
  std::vector<int> device_of;             // stage -> device
  bool cuda = false;
  std::unique_ptr<DeviceRuntime> runtime;
  Schedule schedule;
  std::vector<std::vector<Action>> programs;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;  // per device

  // --- threads ---
  std::vector<std::thread> workers;
  struct Channel {
    int from, to;
    std::thread thread;
    std::deque<std::pair<Key, Handoff>> queue;
    std::vector<std::pair<TraceTask, std::pair<Stamp, Stamp>>> done;  // this step's copies
  };
  std::map<std::pair<int, int>, std::unique_ptr<Channel>> channels;
  // Distributed: what this device receives from another rank, in the order its programme
  // needs it, and the copies that brought it this step.
  struct Receiver {
    int peer;
    std::vector<Key> expected;
    std::thread thread;
    std::vector<TraceTask> done;
  };
  std::vector<std::unique_ptr<Receiver>> receivers;
  int local = -1;                // the device this process runs (distributed), -1: all of them
  double origin_clock_ms = 0.0;  // rank 0's clock at this step's begin_step
  std::mutex mutex;              // guards everything below and the channels' queues
  std::condition_variable wake;
  std::uint64_t generation = 0;
  int workers_running = 0;
  bool shutting_down = false;

  // --- per step ---
  int step_index = 0;
  std::vector<at::Tensor> micro_inputs, micro_targets;
  std::map<Key, Handoff> mailbox;
  struct Context {
    at::Tensor input, output;
  };
  std::vector<Context> contexts;            // stage * micro_batches + micro_batch
  std::vector<at::Tensor> losses;           // per micro-batch, scaled
  std::vector<std::vector<TraceTask>> ran;  // per device
  std::vector<std::vector<Stamp>> stamps;   // per device: start, end of each task
  std::atomic<bool> abort{false};
  std::atomic<bool> stop{false};
  bool broken = false;
  std::string error_message;
  std::unique_ptr<ExecutorError> error;

  Impl(models::Model& m, const Plan& p, std::int64_t batch, ExecutorOptions o)
      : model(m), plan(p), batch_size(batch), options(std::move(o)) {}

  Context& context(int s, int i) {
    return contexts[static_cast<std::size_t>(s) * micro_batches + i];
  }

  void validate_and_place();
  void start_threads();
  void worker_main(int device);
  void channel_main(Channel* channel);
  void receiver_main(Receiver* receiver);
  bool next_step(std::uint64_t& seen);
  void step_done();
  bool is_local(int device) const { return local < 0 || device == local; }
  int tag(const Key& key) const {
    return (key.stage * 2 + static_cast<int>(key.carry)) * micro_batches + key.micro_batch;
  }
  StepRecord merge_ranks(StepRecord local_record);
  void run_action(int device, const Action& a, at::Generator& generator, Handoff incoming);
  void send(Carry carry, int to_stage, int micro_batch, const at::Tensor& tensor, int from_device);
  Handoff take(const Key& key);
  void fail(const Action& a, const std::string& what);
};

void Pipeline::Impl::validate_and_place() {
  const int layers = static_cast<int>(model.layer_names.size());
  if (plan.balance.empty()) throw InputError("plan: balance: expected at least one stage");
  if (is_multi_stage(plan.schedule)) {
    throw InputError(fmt::format(
        "plan: schedule: the executor runs gpipe and 1f1b; {} is simulated and planned only",
        to_string(plan.schedule)));
  }
  long long total = 0;
  for (std::size_t s = 0; s < plan.balance.size(); ++s) {
    if (plan.balance[s] < 1) {
      throw InputError(fmt::format(
          "plan: balance[{}]: expected a positive integer (every stage needs a layer), got {}", s,
          plan.balance[s]));
    }
    total += plan.balance[s];
  }
  if (total != layers) {
    throw InputError(
        fmt::format("plan: balance: expected layer counts summing to {} (the layers of {}), got {}",
                    layers, model.name, total));
  }
  if (plan.chunks < 1 || plan.chunks > batch_size) {
    throw InputError(fmt::format("plan: chunks: expected 1 to {} (the batch size), got {}",
                                 batch_size, plan.chunks));
  }
  stage_count = plan.stages();
  sizes = split_batch(batch_size, plan.chunks);
  micro_batches = static_cast<int>(sizes.size());

  // Which named device each stage runs on.
  std::vector<std::string> stage_device_name(stage_count);
  if (plan.devices.empty()) {
    if (stage_count > static_cast<int>(options.devices.size())) {
      throw InputError(
          fmt::format("plan: {} stages but {} devices (name the plan's devices to put several "
                      "stages on one device)",
                      stage_count, options.devices.size()));
    }
    for (int s = 0; s < stage_count; ++s) stage_device_name[s] = options.devices[s];
  } else {
    for (int s = 0; s < stage_count; ++s) {
      const auto& name = plan.devices[s];
      if (std::find(options.devices.begin(), options.devices.end(), name) ==
          options.devices.end()) {
        throw InputError(
            fmt::format("plan: devices[{}]: \"{}\" is not one of the devices given ({})", s, name,
                        fmt::join(options.devices, ", ")));
      }
      stage_device_name[s] = name;
    }
  }
  // Devices that hold stages, in the order given.
  for (const auto& name : options.devices) {
    if (std::find(stage_device_name.begin(), stage_device_name.end(), name) !=
        stage_device_name.end()) {
      device_names.push_back(name);
    }
  }
  device_of.resize(stage_count);
  for (int s = 0; s < stage_count; ++s) {
    device_of[s] =
        static_cast<int>(std::find(device_names.begin(), device_names.end(), stage_device_name[s]) -
                         device_names.begin());
  }
  if (options.transport) {
    const int world = options.transport->world_size();
    if (static_cast<int>(device_names.size()) != world) {
      throw InputError(
          fmt::format("plan: {} devices ({}) but WORLD_SIZE is {}: a distributed run puts each "
                      "device in its own process",
                      device_names.size(), fmt::join(device_names, ", "), world));
    }
    local = options.transport->rank();
  }
  std::vector<c10::Device> torch_devices;
  int cpu_devices = 0;
  for (const auto& name : device_names) {
    const auto [type, index] = parse_device(name);
    if (type == c10::DeviceType::CUDA) {
      if (!cuda_built())
        throw InputError(fmt::format("device {}: this build of pipetune has no CUDA", name));
      if (index >= cuda_device_count()) {
        throw InputError(fmt::format("device {}: no such CUDA device (this machine has {})", name,
                                     cuda_device_count()));
      }
      if (options.transport) {
        throw InputError(fmt::format(
            "device {}: a distributed run on CUDA (NCCL) is not in this build; use --device cpu",
            name));
      }
      cuda = true;
      torch_devices.emplace_back(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
    } else {
      ++cpu_devices;
      torch_devices.emplace_back(c10::DeviceType::CPU);
    }
  }
  if (cuda && cpu_devices > 0) {
    throw InputError("plan: mixing cpu and cuda devices in one pipeline is not supported");
  }

  if (cuda) {
    runtime = make_cuda_runtime(torch_devices, options.record_memory_history);
  } else {
    // A rank runs one device of its own; worker threads in one process share the cores.
    const int threads = options.threads_per_cpu_device > 0
                            ? options.threads_per_cpu_device
                            : cpu_threads_per_device(options.transport ? 1 : cpu_devices);
    runtime = make_cpu_runtime(static_cast<int>(device_names.size()), threads,
                               options.record_memory_history);
  }

  // Split the model: stage s holds the next balance[s] children.
  auto layer = model.layers->begin();
  int layer_index = 0;
  for (int s = 0; s < stage_count; ++s) {
    torch::nn::Sequential stage;
    for (int k = 0; k < plan.balance[s]; ++k, ++layer, ++layer_index) {
      stage->push_back(model.layer_names[layer_index], *layer);  // shares the module
    }
    // Parameters and buffers become the device's own (moved to it, charged to it); another
    // process's stages stay as built, unused here.
    at::NoGradGuard no_grad;
    if (is_local(device_of[s])) {
      for (auto& p : stage->parameters()) p.set_data(runtime->adopt(p.detach(), device_of[s]));
      for (auto& b : stage->buffers()) b.set_data(runtime->adopt(b.detach(), device_of[s]));
    }
    stage->train();
    stages.push_back(stage);
  }

  schedule = make_schedule(plan.schedule, stage_count, micro_batches, plan.checkpoint);
  programs = device_programs(schedule, device_of, static_cast<int>(device_names.size()));

  // One optimizer per device, over the parameters of every stage it holds.
  optimizers.resize(device_names.size());
  for (int d = 0; d < static_cast<int>(device_names.size()); ++d) {
    if (!is_local(d)) continue;
    std::vector<at::Tensor> params;
    for (int s = 0; s < stage_count; ++s) {
      if (device_of[s] != d) continue;
      for (auto& p : stages[s]->parameters()) params.push_back(p);
    }
    optimizers[d] = make_optimizer(options.optimizer, std::move(params), options.learning_rate);
  }
}

void Pipeline::Impl::start_threads() {
  const int devices = static_cast<int>(device_names.size());
  ran.resize(devices);
  stamps.resize(devices);
  for (int d = 0; d < devices; ++d) {
    if (is_local(d)) workers.emplace_back([this, d] { worker_main(d); });
  }
  if (options.transport) {
    // A receiver per peer that sends here, expecting in this device's programme order.
    std::map<int, Receiver*> by_peer;
    for (const Action& a : programs[local]) {
      int from = -1;
      Key key{};
      if (a.kind == ActionKind::Forward && a.stage > 0 && device_of[a.stage - 1] != local) {
        from = device_of[a.stage - 1];
        key = {Carry::Activation, a.stage, a.micro_batch};
      } else if (a.kind == ActionKind::Backward && a.stage + 1 < stage_count &&
                 device_of[a.stage + 1] != local) {
        from = device_of[a.stage + 1];
        key = {Carry::Gradient, a.stage, a.micro_batch};
      }
      if (from < 0) continue;
      Receiver*& r = by_peer[from];
      if (!r) {
        receivers.push_back(std::make_unique<Receiver>());
        r = receivers.back().get();
        r->peer = from;
      }
      r->expected.push_back(key);
    }
    for (auto& r : receivers) {
      Receiver* receiver = r.get();
      receiver->thread = std::thread([this, receiver] { receiver_main(receiver); });
    }
    return;
  }
  // One copy channel per direction between devices that exchange data.
  for (int s = 0; s + 1 < stage_count; ++s) {
    const int a = device_of[s], b = device_of[s + 1];
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
  wake.notify_all();
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
    wake.wait_for(lock, kPoll);
  }
}

void Pipeline::Impl::send(Carry carry, int to_stage, int micro_batch, const at::Tensor& tensor,
                          int from_device) {
  const int to_device = device_of[to_stage];
  if (!is_local(to_device)) {
    // Another process: the receiver there records the copy, from the time sent along with it.
    const Key key{carry, to_stage, micro_batch};
    options.transport->send(tensor, to_device, tag(key), options.transport->clock_ms());
    return;
  }
  Handoff h = runtime->publish(tensor, from_device);
  std::lock_guard<std::mutex> lock(mutex);
  const Key key{carry, to_stage, micro_batch};
  if (to_device == from_device) {
    mailbox[key] = std::move(h);  // same device: the tensor itself
  } else {
    channels.at({from_device, to_device})->queue.emplace_back(key, std::move(h));
  }
  wake.notify_all();
}

void Pipeline::Impl::channel_main(Channel* c) {
  name_this_thread(fmt::format("pt-copy-{}-{}", c->from, c->to));
  runtime->bind_copy_thread(c->from, c->to);
  std::unique_lock<std::mutex> lock(mutex);
  for (;;) {
    while (c->queue.empty() && !shutting_down) wake.wait_for(lock, kPoll);
    if (shutting_down) return;
    auto [key, handoff] = std::move(c->queue.front());
    c->queue.pop_front();
    if (abort) continue;  // a stage failed: drop what is in flight
    lock.unlock();
    Handoff moved;
    Stamp begin, end;
    try {
      begin = runtime->now(c->to);
      moved = runtime->copy(handoff, c->from, c->to);
      end = runtime->now(c->to);
    } catch (const std::exception& e) {
      const int sender = key.carry == Carry::Activation ? key.stage - 1 : key.stage + 1;
      fail(Action{key.carry == Carry::Activation ? ActionKind::Forward : ActionKind::Backward,
                  sender, key.micro_batch},
           fmt::format("copy to {}: {}", device_names[c->to], e.what()));
      lock.lock();
      continue;
    }
    TraceTask t;
    t.kind = key.carry == Carry::Activation ? TaskKind::SendActivation : TaskKind::SendGradient;
    t.stage = key.carry == Carry::Activation ? key.stage - 1 : key.stage + 1;
    t.micro_batch = key.micro_batch;
    t.device = c->from;
    t.peer = c->to;
    t.step = step_index;
    t.bytes = static_cast<std::int64_t>(handoff.tensor.nbytes());
    handoff = {};  // the sender's buffer may go now (CUDA: after the copy, by record_stream)
    lock.lock();
    c->done.push_back({t, {begin, end}});
    mailbox[key] = std::move(moved);
    wake.notify_all();
  }
}

// A worker's or receiver's wait for the next step; false when the pipeline shuts down.
bool Pipeline::Impl::next_step(std::uint64_t& seen) {
  std::unique_lock<std::mutex> lock(mutex);
  while (generation == seen && !shutting_down) wake.wait_for(lock, kPoll);
  seen = generation;
  return !shutting_down;
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
      const int sender = activation ? key.stage - 1 : key.stage + 1;
      try {
        Received got = options.transport->recv(r->peer, tag(key));
        const Stamp arrived = runtime->now(local);
        TraceTask t;
        t.kind = activation ? TaskKind::SendActivation : TaskKind::SendGradient;
        t.stage = sender;
        t.micro_batch = key.micro_batch;
        t.device = r->peer;
        t.peer = local;
        t.step = step_index;
        t.bytes = static_cast<std::int64_t>(got.tensor.nbytes());
        t.start_ms = got.sent_ms - origin_clock_ms;  // the sender's clock, as rank 0 reads it
        t.end_ms = runtime->resolve(arrived);
        std::lock_guard<std::mutex> lock(mutex);
        r->done.push_back(t);
        mailbox[key] = Handoff{got.tensor, nullptr};
        wake.notify_all();
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

void Pipeline::Impl::run_action(int d, const Action& a, at::Generator& generator,
                                Handoff incoming) {
  const int s = a.stage, i = a.micro_batch;
  const bool last = s + 1 == stage_count;
  Context& ctx = context(s, i);
  // The same seed for a micro-batch's forward and its recompute: identical dropout masks.
  generator.set_current_seed(
      mix(options.seed ^ mix(static_cast<std::uint64_t>(step_index) << 32 ^
                             static_cast<std::uint64_t>(s) << 16 ^ static_cast<std::uint64_t>(i))));
  models::ScopedGenerator use(&generator);
  const double scale = static_cast<double>(sizes[i]) / static_cast<double>(batch_size);

  switch (a.kind) {
    case ActionKind::Forward: {
      at::Tensor x = s == 0 ? micro_inputs[i] : runtime->consume(incoming, d);
      if (s > 0 && at::isFloatingType(x.scalar_type())) x.requires_grad_(true);
      ctx.input = x;
      at::Tensor y;
      if (schedule.recomputes(i)) {
        at::NoGradGuard no_grad;  // keep only the input; the recompute rebuilds the graph
        y = stages[s]->forward(x);
        if (last) losses[i] = model.loss(y, micro_targets[i]).detach() * scale;
      } else {
        y = stages[s]->forward(x);
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
      models::ScopedRecompute recomputing;
      at::Tensor y = stages[s]->forward(ctx.input);
      ctx.output = last ? model.loss(y, micro_targets[i]) * scale : y;
      break;
    }
    case ActionKind::Backward: {
      if (last) {
        torch::autograd::backward({ctx.output});
      } else {
        const at::Tensor gradient = runtime->consume(incoming, d);
        torch::autograd::backward({ctx.output}, {gradient});
      }
      if (s > 0) {
        at::Tensor input_gradient = ctx.input.grad();
        send(Carry::Gradient, s - 1, i, input_gradient, d);
      }
      ctx = {};
      break;
    }
  }
}

void Pipeline::Impl::worker_main(int d) {
  name_this_thread(fmt::format("pt-compute-{}", d));
  runtime->bind_compute_thread(d);
  at::Generator generator = runtime->make_generator(d);
  std::uint64_t seen = 0;
  while (next_step(seen)) {
    Action current{};
    try {
      // Gradients start from nothing each step; the first backward allocates them.
      for (int s = 0; s < stage_count; ++s) {
        if (device_of[s] != d) continue;
        for (auto& p : stages[s]->parameters()) p.mutable_grad().reset();
      }
      for (const Action& a : programs[d]) {
        if (abort || stop) throw Aborted{};
        current = a;
        // Wait for what the action needs from another stage first: a task's time is its own
        // work, and the wait is the dependency's (the simulator and replay count it there).
        Handoff incoming;
        if (a.kind == ActionKind::Forward && a.stage > 0)
          incoming = take({Carry::Activation, a.stage, a.micro_batch});
        if (a.kind == ActionKind::Backward && a.stage + 1 < stage_count) {
          incoming = take({Carry::Gradient, a.stage, a.micro_batch});
        }
        const Stamp begin = runtime->now(d);
        runtime->sample_memory(d, begin);
        run_action(d, a, generator, std::move(incoming));
        const Stamp end = runtime->now(d);
        runtime->sample_memory(d, end);
        TraceTask t;
        t.kind = a.kind == ActionKind::Forward     ? TaskKind::Forward
                 : a.kind == ActionKind::Recompute ? TaskKind::Recompute
                                                   : TaskKind::Backward;
        t.stage = a.stage;
        t.micro_batch = a.micro_batch;
        t.device = d;
        t.step = step_index;
        ran[d].push_back(t);
        stamps[d].push_back(begin);
        stamps[d].push_back(end);
      }
      // Every backward of this device's stages is done: its parameters can step.
      if (optimizers[d] && !abort && !stop) optimizers[d]->step();
    } catch (const Aborted&) {
    } catch (const std::exception& e) {
      fail(current, e.what());
    }
    step_done();
  }
}

Pipeline::Pipeline(models::Model& model, const Plan& plan, std::int64_t batch_size,
                   ExecutorOptions options)
    : impl_(std::make_unique<Impl>(model, plan, batch_size, std::move(options))) {
  impl_->validate_and_place();
  impl_->start_threads();
}

Pipeline::~Pipeline() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->shutting_down = true;
    impl_->abort = true;
    impl_->wake.notify_all();
  }
  for (auto& t : impl_->workers) t.join();
  for (auto& [key, c] : impl_->channels) c->thread.join();
  for (auto& r : impl_->receivers) r->thread.join();
}

StepRecord Pipeline::step(const at::Tensor& input, const at::Tensor& target) {
  Impl& m = *impl_;
  if (m.broken)
    throw std::logic_error("the pipeline failed in an earlier step and cannot run again");
  if (input.size(0) != m.batch_size || target.size(0) != m.batch_size) {
    throw InputError(fmt::format("batch: expected {} samples, got {} inputs and {} targets",
                                 m.batch_size, input.size(0), target.size(0)));
  }
  const auto started = Clock::now();
  // Scatter: micro-batches as tensor.chunk makes them, charged to the first (inputs) and the
  // last (targets) stage's device.
  m.micro_inputs.clear();
  m.micro_targets.clear();
  if (m.is_local(m.device_of.front()))
    m.micro_inputs = m.runtime->adopt(input, m.device_of.front()).chunk(m.plan.chunks);
  if (m.is_local(m.device_of.back()))
    m.micro_targets = m.runtime->adopt(target, m.device_of.back()).chunk(m.plan.chunks);
  m.contexts.assign(static_cast<std::size_t>(m.stage_count) * m.micro_batches, {});
  m.losses.assign(m.micro_batches, {});
  for (auto& r : m.ran) r.clear();
  for (auto& s : m.stamps) s.clear();
  for (auto& [key, c] : m.channels) c->done.clear();
  for (auto& r : m.receivers) r->done.clear();
  m.mailbox.clear();

  Transport* transport = m.options.transport.get();
  // What fails between the ranks names the step (counted from 1, warm-up included).
  const auto between_ranks = [&m](const auto& work) {
    try {
      return work();
    } catch (const WorkError& e) {
      m.broken = true;
      // Ctrl-C reaches every rank at about the same time: a peer that stopped first is no fault.
      if (m.stop) throw Interrupted();
      throw WorkError(fmt::format("step {}: {}", m.step_index + 1, e.what()));
    } catch (...) {
      m.broken = true;
      throw;
    }
  };
  if (transport) {
    if (m.stop) {
      m.broken = true;
      throw Interrupted();
    }
    between_ranks([&] { transport->barrier(fmt::format("step {}", m.step_index + 1)); });
  }
  m.runtime->begin_step();
  if (transport) m.origin_clock_ms = transport->clock_ms();
  {
    std::unique_lock<std::mutex> lock(m.mutex);
    m.workers_running = static_cast<int>(m.workers.size() + m.receivers.size());
    ++m.generation;
    m.wake.notify_all();
    bool cancelled = false;
    while (m.workers_running > 0) {
      m.wake.wait_for(lock, kPoll);
      // A receiver blocked on a peer must not hold up a step that failed or stopped here (the
      // signal handler cannot do this itself: it may only set the flag).
      if (transport && (m.abort || m.stop) && !cancelled) {
        cancelled = true;
        lock.unlock();
        transport->cancel_receives();
        lock.lock();
      }
    }
  }
  m.runtime->end_step();
  if (transport && !m.error && !m.stop) {
    between_ranks(
        [&] { transport->flush_sends(); });  // the peers have what it sent: their step is over too
  }
  const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();

  m.micro_inputs.clear();
  m.micro_targets.clear();
  m.contexts.clear();
  if (m.error) {
    m.broken = true;
    throw *m.error;
  }
  if (m.stop) {
    m.broken = true;
    throw Interrupted();
  }
  for (int s = 0; s < m.stage_count; ++s) {
    if (m.is_local(m.device_of[s])) models::commit_deferred_batch_norms(*m.stages[s]);
  }

  StepRecord record;
  record.step = m.step_index++;
  record.step_ms = step_ms;
  double loss = 0.0;
  for (const auto& l : m.losses) {
    if (l.defined()) loss += l.item<double>();  // only the last stage's process has them
  }
  record.loss = loss;
  for (std::size_t d = 0; d < m.ran.size(); ++d) {
    for (std::size_t k = 0; k < m.ran[d].size(); ++k) {
      TraceTask t = m.ran[d][k];
      t.start_ms = m.runtime->resolve(m.stamps[d][2 * k]);
      t.end_ms = m.runtime->resolve(m.stamps[d][2 * k + 1]);
      record.tasks.push_back(t);
    }
  }
  for (auto& [key, c] : m.channels) {
    for (auto& [task, span] : c->done) {
      TraceTask t = task;
      t.start_ms = m.runtime->resolve(span.first);
      t.end_ms = m.runtime->resolve(span.second);
      record.tasks.push_back(t);
    }
  }
  for (auto& r : m.receivers)
    record.tasks.insert(record.tasks.end(), r->done.begin(), r->done.end());
  record.pipeline_ms = pipeline_ms(record.tasks);
  for (std::size_t d = 0; d < m.device_names.size(); ++d) {
    record.peak_memory_bytes.push_back(m.runtime->peak(static_cast<int>(d)));
  }
  if (m.options.record_memory_history) record.memory = m.runtime->memory_history();
  if (transport) return between_ranks([&] { return m.merge_ranks(std::move(record)); });
  return record;
}

// Every rank sends rank 0 its part of the step; rank 0 puts the parts on its own clock. Device
// d runs on rank d, so a rank's tasks already name the right devices.
StepRecord Pipeline::Impl::merge_ranks(StepRecord mine) {
  nlohmann::json part;
  part["origin_ms"] = origin_clock_ms;
  part["loss"] = mine.loss;
  part["step_ms"] = mine.step_ms;
  part["peak"] = mine.peak_memory_bytes.at(local);
  auto& tasks = part["tasks"] = nlohmann::json::array();
  for (const auto& t : mine.tasks) {
    tasks.push_back({static_cast<int>(t.kind), t.stage, t.micro_batch, t.device, t.peer, t.bytes,
                     t.start_ms, t.end_ms});
  }
  auto& memory = part["memory"] = nlohmann::json::array();
  if (static_cast<int>(mine.memory.size()) > local) {
    for (const auto& sample : mine.memory[local]) memory.push_back({sample.time, sample.value});
  }
  const std::vector<std::string> parts =
      options.transport->gather(fmt::format("step {}", mine.step + 1), part.dump());
  if (parts.empty()) return mine;  // not rank 0: this rank's part

  StepRecord merged;
  merged.step = mine.step;
  merged.step_ms = 0.0;
  merged.peak_memory_bytes.assign(parts.size(), 0);
  if (options.record_memory_history) merged.memory.resize(parts.size());
  for (std::size_t r = 0; r < parts.size(); ++r) {
    const auto j = nlohmann::json::parse(parts[r]);
    const double shift = j.at("origin_ms").get<double>() - origin_clock_ms;
    merged.loss += j.at("loss").get<double>();
    merged.step_ms = std::max(merged.step_ms, j.at("step_ms").get<double>());
    merged.peak_memory_bytes[r] = j.at("peak").get<std::int64_t>();
    for (const auto& row : j.at("tasks")) {
      TraceTask t;
      t.kind = static_cast<TaskKind>(row[0].get<int>());
      t.stage = row[1].get<int>();
      t.micro_batch = row[2].get<int>();
      t.device = row[3].get<int>();
      t.peer = row[4].get<int>();
      t.bytes = row[5].get<std::int64_t>();
      t.start_ms = row[6].get<double>() + shift;
      t.end_ms = row[7].get<double>() + shift;
      t.step = merged.step;
      merged.tasks.push_back(t);
    }
    if (options.record_memory_history) {
      for (const auto& sample : j.at("memory")) {
        merged.memory[r].push_back(
            {sample[0].get<double>() + shift, sample[1].get<std::int64_t>()});
      }
    }
  }
  merged.pipeline_ms = pipeline_ms(merged.tasks);
  return merged;
}

void Pipeline::request_stop() {
  impl_->stop = true;
}
const std::vector<std::string>& Pipeline::device_names() const {
  return impl_->device_names;
}
const std::vector<int>& Pipeline::stage_device() const {
  return impl_->device_of;
}
std::vector<torch::nn::Sequential>& Pipeline::stages() {
  return impl_->stages;
}
const Plan& Pipeline::plan() const {
  return impl_->plan;
}
const std::vector<std::int64_t>& Pipeline::micro_batch_sizes() const {
  return impl_->sizes;
}

}  // namespace pipetune::exec

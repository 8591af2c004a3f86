#include "distributed/process_group.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "sim/error.hpp"

#ifdef PIPETUNE_WITH_GLOO
#include <ATen/ATen.h>
#include <c10/util/Logging.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace pipetune::distributed {

namespace {

int read_int(const char* name, int min, int max, std::optional<int> fallback = std::nullopt) {
  const char* text = std::getenv(name);
  if (!text || !*text) {
    if (fallback) return *fallback;
    throw InputError(Input::Distributed,
                     fmt::format("{} is not set (start the ranks with pipetune launch, torchrun "
                                 "or srun, which set RANK, "
                                 "WORLD_SIZE, MASTER_ADDR and MASTER_PORT)",
                                 name));
  }
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || errno != 0 || value < min || value > max) {
    throw InputError(Input::Distributed, fmt::format("{}=\"{}\": expected an integer from {} to {}",
                                                     name, text, min, max));
  }
  return static_cast<int>(value);
}

double steady_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

LaunchEnvironment read_launch_environment() {
  LaunchEnvironment env;
  env.world_size = read_int("WORLD_SIZE", 1, 1 << 16);
  env.rank = read_int("RANK", 0, env.world_size - 1);
  env.local_rank = read_int("LOCAL_RANK", 0, 1 << 16, env.rank);
  env.local_world_size = read_int("LOCAL_WORLD_SIZE", 1, 1 << 16, env.world_size);
  const char* addr = std::getenv("MASTER_ADDR");
  if (!addr || !*addr) {
    throw InputError(Input::Distributed,
                     "MASTER_ADDR is not set (the host of rank 0, where the ranks meet)");
  }
  env.master_addr = addr;
  env.master_port = read_int("MASTER_PORT", 1, 65535);
  return env;
}

#ifndef PIPETUNE_WITH_GLOO

bool gloo_built() {
  return false;
}

std::shared_ptr<exec::Transport> connect(const LaunchEnvironment&, double) {
  throw InputError(Input::Distributed,
                   "this build of pipetune has no Gloo (install libgloo-dev and rebuild)");
}

#else

bool gloo_built() {
  return true;
}

namespace {

// A tensor travels as a fixed header (dtype, shape, when it was sent, where its data goes) and
// then its data, each with its own tag, so the receiver can allocate before the data comes.
//
// Each Gloo message is a rendezvous, and on a CPU whose cores the compute threads keep busy every
// thread wake-up it takes can wait for a core: with the data's receive posted only once the header
// is in, a copy took about five (header in, data receive posted, the sender's Gloo thread
// answering it and writing the data, data in, receiver thread), and a few copies per step took
// 5-15 ms instead of 0.4. So from the second tensor on a (peer, tag), the receiver posts the data's
// receive with the header's, at the dtype and shape that (peer, tag) carried last, and the sender,
// which keeps the same record, writes the data at once from its own thread. A tensor of another
// dtype or shape goes on a third tag, after a stand-in of the old layout for the receive already
// posted (a posted Gloo receive cannot be taken back); the header says which.
constexpr int kMaxDims = 8;
constexpr int kHeader = 4 + kMaxDims;     // dtype, dims, shape..., sent_ms, data tag
constexpr int kAsBefore = 1, kMoved = 2;  // the data's tag: 3 * tag + 1 or 3 * tag + 2

// The dtype and shape a (peer, tag) carried last.
struct Layout {
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> shape;
  bool operator==(const Layout&) const = default;
  at::Tensor allocate() const { return at::empty(shape, at::TensorOptions().dtype(dtype)); }
};

// c10d's message, less what says nothing to a user: the C++ stack trace c10 appends, gloo's
// source location and its boilerplate advice.
std::string why(const std::exception& e) {
  std::string what = e.what();
  const auto newline = what.find('\n');
  if (newline != std::string::npos) what.resize(newline);
  if (!what.empty() && what.front() == '[') {
    const auto close = what.find("] ");
    if (close != std::string::npos) what.erase(0, close + 2);
  }
  const auto advice = what.find(". This is typically");
  if (advice != std::string::npos) what.resize(advice);
  return what;
}

class GlooTransport final : public exec::Transport {
 public:
  GlooTransport(const LaunchEnvironment& env, double timeout_s) : env_(env), timeout_s_(timeout_s) {
    const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1e3));
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.master_port);
    options.isServer = env.rank == 0;
    options.numWorkers = env.world_size;
    options.waitWorkers = true;
    options.timeout = timeout;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    } catch (const std::exception& e) {
      throw WorkError(fmt::format("the {} ranks did not all meet at {}:{} within {} s: {}",
                                  env.world_size, env.master_addr, env.master_port, timeout_s,
                                  why(e)));
    }
    align_clocks();
    start_heartbeat();
    auto group_options = c10d::ProcessGroupGloo::Options::create(timeout);
    const bool loopback = env.master_addr == "localhost" || env.master_addr.rfind("127.", 0) == 0;
    group_options->devices.push_back(
        loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                 : c10d::ProcessGroupGloo::createDefaultDevice());
    try {
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, env.rank, env.world_size,
                                                           group_options);
    } catch (const std::exception& e) {
      throw WorkError(fmt::format("connecting the Gloo group: {}", why(e)));
    }
    releaser_ = std::thread([this] { release_sends(); });
  }

  // Never waits on a peer longer than kStopBound: the heartbeat may be blocked in a store call
  // to a rank 0 that is stopped or unreachable, for up to the timeout. It owns what it uses, so
  // when it does not stop in time it is left to finish (or fail) on its own.
  ~GlooTransport() override {
    stop_releasing_sends();
    if (!heartbeat_) return;
    std::unique_lock<std::mutex> lock(heartbeat_->mutex);
    heartbeat_->stopping = true;
    heartbeat_->wake.notify_all();
    if (heartbeat_->wake.wait_for(lock, kStopBound, [&] { return heartbeat_->finished; })) {
      lock.unlock();
      heartbeat_thread_.join();
    } else {
      lock.unlock();
      heartbeat_thread_.detach();
    }
  }
  GlooTransport(const GlooTransport&) = delete;
  GlooTransport& operator=(const GlooTransport&) = delete;

  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  double timeout_s() const override { return timeout_s_; }
  double clock_ms() const override { return steady_ms() + offset_ms_; }
  double clock_offset_ms() const override { return offset_ms_; }
  double clock_round_trip_ms() const override { return round_trip_ms_; }

  void send(const at::Tensor& tensor, int to_rank, int tag, double sent_ms) override {
    // Gloo reads the tensor's data as host memory (DeviceRuntime::depart stages a GPU's).
    if (!tensor.is_cpu()) {
      throw std::logic_error(
          fmt::format("sending to rank {}: a {} tensor; the transport carries "
                      "host memory",
                      to_rank, tensor.device().str()));
    }
    if (tensor.dim() > kMaxDims) {
      throw WorkError(fmt::format("sending to rank {}: {} dimensions, at most {} travel", to_rank,
                                  tensor.dim(), kMaxDims));
    }
    const Layout layout{tensor.scalar_type(), tensor.sizes().vec()};
    std::optional<Layout> before;
    {
      std::lock_guard<std::mutex> lock(layouts_mutex_);
      auto [it, fresh] = sent_layouts_.try_emplace({to_rank, tag}, layout);
      if (!fresh) before = std::exchange(it->second, layout);
    }
    const bool moved = before && !(*before == layout);
    at::Tensor header = at::zeros({kHeader}, at::kLong);
    auto* h = header.data_ptr<std::int64_t>();
    h[0] = static_cast<std::int64_t>(layout.dtype);
    h[1] = static_cast<std::int64_t>(layout.shape.size());
    std::copy(layout.shape.begin(), layout.shape.end(), h + 2);
    std::memcpy(&h[2 + kMaxDims], &sent_ms, sizeof sent_ms);
    h[3 + kMaxDims] = moved ? kMoved : kAsBefore;
    std::vector<at::Tensor> header_list{header}, data_list{tensor.contiguous()};
    std::lock_guard<std::mutex> lock(mutex_);
    sending_.push_back(
        {to_rank, post(to_rank, [&] { return group_->send(header_list, to_rank, 3 * tag); })});
    if (moved) {
      std::vector<at::Tensor> stand_in{before->allocate().zero_()};
      sending_.push_back({to_rank, post(to_rank, [&] {
                            return group_->send(stand_in, to_rank, 3 * tag + kAsBefore);
                          })});
    }
    sending_.push_back({to_rank, post(to_rank, [&] {
                          return group_->send(data_list, to_rank,
                                              3 * tag + (moved ? kMoved : kAsBefore));
                        })});
    sends_changed_.notify_all();
  }

  exec::Received recv(int from_rank, int tag) override {
    std::optional<Layout> before;
    {
      std::lock_guard<std::mutex> lock(layouts_mutex_);
      const auto it = received_layouts_.find({from_rank, tag});
      if (it != received_layouts_.end()) before = it->second;
    }
    std::vector<at::Tensor> header{at::empty({kHeader}, at::kLong)};
    auto header_work = post(from_rank, [&] { return group_->recv(header, from_rank, 3 * tag); });
    // Posted now, before the header is in: see the top of this file.
    std::vector<at::Tensor> posted;
    c10::intrusive_ptr<c10d::Work> posted_work;
    if (before) {
      posted.push_back(before->allocate());
      posted_work =
          post(from_rank, [&] { return group_->recv(posted, from_rank, 3 * tag + kAsBefore); });
    }
    receive(header_work, from_rank);
    const auto* h = header[0].data_ptr<std::int64_t>();
    const Layout layout{static_cast<at::ScalarType>(h[0]),
                        std::vector<std::int64_t>(h + 2, h + 2 + h[1])};
    exec::Received got;
    std::memcpy(&got.sent_ms, &h[2 + kMaxDims], sizeof got.sent_ms);
    if (posted_work) receive(posted_work, from_rank);
    if (before && h[3 + kMaxDims] == kAsBefore) {
      if (!(layout == *before)) {
        throw WorkError(fmt::format(
            "rank {} sent a tensor of another shape than its last one on tag {} without saying so",
            from_rank, tag));
      }
      got.tensor = posted[0];
    } else {
      // The first tensor on this (peer, tag), or one of another layout after its stand-in.
      std::vector<at::Tensor> data{layout.allocate()};
      receive(post(from_rank,
                   [&] {
                     return group_->recv(data, from_rank, 3 * tag + (before ? kMoved : kAsBefore));
                   }),
              from_rank);
      got.tensor = data[0];
    }
    std::lock_guard<std::mutex> lock(layouts_mutex_);
    received_layouts_[{from_rank, tag}] = layout;
    return got;
  }

  void flush_sends() override {
    std::unique_lock<std::mutex> lock(mutex_);
    sends_changed_.wait(lock, [&] { return sending_.empty(); });
    if (send_error_) std::rethrow_exception(std::exchange(send_error_, nullptr));
  }

  // Gloo's barrier notices a dead rank at once, but not which one: the heartbeats tell.
  void barrier(const std::string& what) override {
    const auto started = std::chrono::steady_clock::now();
    try {
      group_->barrier()->wait(timeout());
    } catch (const std::exception& e) {
      const std::vector<int> stalled = stalled_ranks();
      const std::string who =
          stalled.empty() ? "a rank" : "rank " + fmt::format("{}", fmt::join(stalled, ", "));
      if (waited_out(started)) {
        throw TimeoutError(fmt::format("{} did not reach {} within {} s", who, what, timeout_s_));
      }
      throw WorkError(fmt::format("{} is gone before {} ({})", who, what, why(e)));
    }
  }

  void cancel_receives() override {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
    for (auto& work : receiving_) work->abort();
  }

  void leave_after_failure() override {
    try {
      if (env_.rank != 0) {
        store_->set("pipetune/failed/" + std::to_string(env_.rank), std::vector<std::uint8_t>{1});
        return;
      }
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
      while (std::chrono::steady_clock::now() < deadline) {
        const std::vector<int> stalled = stalled_ranks();
        bool all_done = true;
        for (int r = 1; r < env_.world_size; ++r) {
          const bool failed = store_->check({"pipetune/failed/" + std::to_string(r)});
          if (!failed && std::find(stalled.begin(), stalled.end(), r) == stalled.end())
            all_done = false;
        }
        if (all_done) return;
      }
    } catch (const std::exception&) {
      // Leaving anyway: this rank has failed already and says so itself.
    }
  }

  std::vector<std::string> gather(const std::string& key, const std::string& blob) override {
    const std::string prefix = "pipetune/gather/" + key + "/";
    const std::vector<std::uint8_t> bytes(blob.begin(), blob.end());
    store_->set(prefix + std::to_string(env_.rank), bytes);
    if (env_.rank != 0) return {};
    std::vector<std::string> all;
    for (int r = 0; r < env_.world_size; ++r) {
      try {
        const auto value = reported(r, prefix + std::to_string(r), key);
        all.emplace_back(value.begin(), value.end());
        store_->deleteKey(prefix + std::to_string(r));
      } catch (const WorkError&) {
        throw;
      } catch (const std::exception& e) {
        throw WorkError(
            fmt::format("rank {} did not report {} within {} s: {}", r, key, timeout_s_, why(e)));
      }
    }
    return all;
  }

 private:
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s_ * 1e3));
  }

  // c10d reports a timeout as an error like any other, with no type of its own: a wait that
  // failed after (nearly) its whole bound is taken as one. Its own message is not parsed.
  bool waited_out(std::chrono::steady_clock::time_point started) const {
    return std::chrono::steady_clock::now() - started >= timeout() * 9 / 10;
  }

  // Rank r's `key` from the store, once r has set it. A rank killed after its step's work but
  // before it reported would otherwise hold rank 0 in a blocking get for the whole timeout (the
  // survivors all failed at once, rank 0 after 20 s); its heartbeat standing still for 2 s
  // names it. A stopped rank's heartbeat stands still too: it is named the same way.
  std::vector<std::uint8_t> reported(int r, const std::string& key, const std::string& what) {
    const auto started = std::chrono::steady_clock::now();
    std::int64_t beat = beat_of(r);
    auto beat_seen = started;
    while (true) {
      try {
        store_->wait({key}, kBeat);  // returns as soon as the key is there
        return store_->get(key);
      } catch (const c10::Error&) {
        // Not yet: a wait that runs out throws.
      }
      const auto now = std::chrono::steady_clock::now();
      if (now - started >= timeout()) {
        throw WorkError(fmt::format("rank {} did not report {} within {} s", r, what, timeout_s_));
      }
      const std::int64_t latest = beat_of(r);
      if (latest != beat) {
        beat = latest;
        beat_seen = now;
      } else if (now - beat_seen >= 10 * kBeat) {
        throw WorkError(fmt::format(
            "rank {} is gone before it reported {} (its heartbeat stood still for {} s)", r, what,
            std::chrono::duration<double>(10 * kBeat).count()));
      }
    }
  }

  // Lets go of each sent tensor as soon as its peer has it, as a copy within one process does
  // (and as the simulator's memory model has it): a send's work holds its tensor, and a sender
  // keeps nothing it sent, so holding the works until the next send or the step's end raised
  // this device's peak by the gradients sent in between. Works are waited for in the order they
  // were posted; the first failure is kept for flush_sends() to report.
  void release_sends() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      sends_changed_.wait(lock, [&] { return stopping_ || !sending_.empty(); });
      if (sending_.empty()) return;
      auto [to, work] = sending_.front();
      lock.unlock();
      std::exception_ptr error;
      try {
        wait(work, to, "receive");
      } catch (...) {
        error = std::current_exception();
      }
      work.reset();
      lock.lock();
      if (error && !send_error_ && !stopping_) send_error_ = error;
      sending_.pop_front();
      sends_changed_.notify_all();
    }
  }

  // Sends still under way are aborted: the transport is going, and a peer that never receives
  // them must not hold this process up.
  void stop_releasing_sends() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      for (auto& [to, work] : sending_) {
        try {
          work->abort();
        } catch (const std::exception&) {
          // Already completed or failed: the releaser's wait returns either way.
        }
      }
      sends_changed_.notify_all();
    }
    if (releaser_.joinable()) releaser_.join();
  }

  // Posts a send or a receive: gloo refuses one at once on a pair whose peer closed it, before
  // any wait could name the peer.
  template <typename Post>
  c10::intrusive_ptr<c10d::Work> post(int peer, Post&& post_it) {
    try {
      return post_it();
    } catch (const std::exception& e) {
      throw WorkError(fmt::format("rank {} is gone ({})", peer, why(e)));
    }
  }

  // A receive that cancel_receives() can wake: it is known while it waits.
  void receive(const c10::intrusive_ptr<c10d::Work>& work, int peer) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_) throw WorkError("cancelled");
      receiving_.push_back(work);
    }
    struct Forget {
      GlooTransport* self;
      const c10::intrusive_ptr<c10d::Work>& work;
      ~Forget() {
        std::lock_guard<std::mutex> lock(self->mutex_);
        std::erase(self->receiving_, work);
      }
    } forget{this, work};
    wait(work, peer, "send");
  }

  void wait(const c10::intrusive_ptr<c10d::Work>& work, int peer, const char* verb) {
    bool completed = false;
    const auto started = std::chrono::steady_clock::now();
    try {
      completed = work->wait(timeout());
    } catch (const std::exception& e) {
      if (waited_out(started)) {
        throw TimeoutError(
            fmt::format("rank {} did not {} within {} s (hung?)", peer, verb, timeout_s_));
      }
      throw WorkError(fmt::format("rank {} is gone ({})", peer, why(e)));
    }
    if (!completed) throw WorkError("cancelled");  // gloo's answer to an aborted wait
  }

  // A rank's pulse in the store, from a thread with a connection of its own (a blocking get on
  // the main connection must not stop it): a rank whose count stands still is dead or stopped.
  void start_heartbeat() {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env_.master_port);
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = timeout();
    heartbeat_ = std::make_shared<Heartbeat>();
    heartbeat_->store = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, options);
    // The thread shares ownership of its state, and calls the store without holding the lock,
    // so the destructor can always tell it to stop and, if it is stuck, leave it.
    heartbeat_thread_ = std::thread([beat = heartbeat_, rank = env_.rank] {
      const std::string key = heartbeat_key(rank);
      std::unique_lock<std::mutex> lock(beat->mutex);
      while (!beat->stopping) {
        lock.unlock();
        bool gone = false;
        try {
          beat->store->add(key, 1);
        } catch (const std::exception&) {
          gone = true;  // the store is gone (rank 0 has finished or failed): nobody listens
        }
        lock.lock();
        if (gone) break;
        beat->wake.wait_for(lock, kBeat, [&] { return beat->stopping; });
      }
      beat->finished = true;
      beat->wake.notify_all();
    });
  }

  static std::string heartbeat_key(int rank) {
    return "pipetune/heartbeat/" + std::to_string(rank);
  }
  // Rank r's pulse: how many beats it has posted so far.
  std::int64_t beat_of(int rank) { return store_->add(heartbeat_key(rank), 0); }

  // The ranks whose pulse stood still over a few beats; rank 0 when the store itself is gone.
  std::vector<int> stalled_ranks() {
    try {
      const auto beats = [this] {
        std::vector<std::int64_t> count;
        for (int r = 0; r < env_.world_size; ++r) {
          count.push_back(beat_of(r));
        }
        return count;
      };
      const auto before = beats();
      std::this_thread::sleep_for(5 * kBeat);
      const auto after = beats();
      std::vector<int> stalled;
      for (int r = 0; r < env_.world_size; ++r) {
        if (after[r] == before[r]) stalled.push_back(r);
      }
      return stalled;
    } catch (const std::exception&) {
      return {0};
    }
  }

  static constexpr auto kBeat = std::chrono::milliseconds(200);
  // The longest a destructor waits for the heartbeat (docs/distributed.md).
  static constexpr auto kStopBound = std::chrono::milliseconds(500);

  struct Heartbeat {
    c10::intrusive_ptr<c10d::TCPStore> store;  // a connection of its own
    std::mutex mutex;
    std::condition_variable wake;
    bool stopping = false;
    bool finished = false;
  };

  // Rank 0's clock as each rank reads it, through the store: rank r posts a ping, rank 0 answers
  // with its clock, r takes the midpoint of its round trip; the shortest of several rounds wins
  // (NTP's rule: the least queued exchange is the most symmetric).
  void align_clocks() {
    constexpr int kRounds = 8;
    const auto bytes = [](const std::string& s) {
      return std::vector<std::uint8_t>(s.begin(), s.end());
    };
    if (env_.rank == 0) {
      for (int r = 1; r < env_.world_size; ++r) {
        for (int k = 0; k < kRounds; ++k) {
          const std::string key = fmt::format("pipetune/clock/{}/{}/", r, k);
          store_->get(key + "ping");
          store_->set(key + "pong", bytes(fmt::format("{:.6f}", steady_ms())));
        }
      }
      return;
    }
    round_trip_ms_ = std::numeric_limits<double>::infinity();
    for (int k = 0; k < kRounds; ++k) {
      const std::string key = fmt::format("pipetune/clock/{}/{}/", env_.rank, k);
      const double sent = steady_ms();
      store_->set(key + "ping", bytes("1"));
      const auto answer = store_->get(key + "pong");
      const double back = steady_ms();
      const double rank0 = std::stod(std::string(answer.begin(), answer.end()));
      if (back - sent < round_trip_ms_) {
        round_trip_ms_ = back - sent;
        offset_ms_ = rank0 - (sent + back) / 2.0;
      }
      store_->deleteKey(key + "ping");
      store_->deleteKey(key + "pong");
    }
  }

  LaunchEnvironment env_;
  double timeout_s_;
  double offset_ms_ = 0.0, round_trip_ms_ = 0.0;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  std::mutex mutex_;
  std::mutex layouts_mutex_;  // sent_layouts_ and received_layouts_ (see the top of this file)
  std::map<std::pair<int, int>, Layout> sent_layouts_, received_layouts_;  // by (peer, tag)
  std::deque<std::pair<int, c10::intrusive_ptr<c10d::Work> > > sending_;   // oldest first
  std::condition_variable sends_changed_;
  std::exception_ptr send_error_;
  bool stopping_ = false;
  std::thread releaser_;
  std::vector<c10::intrusive_ptr<c10d::Work> > receiving_;
  bool cancelled_ = false;
  std::shared_ptr<Heartbeat> heartbeat_;
  std::thread heartbeat_thread_;
};

}  // namespace

std::shared_ptr<exec::Transport> connect(const LaunchEnvironment& env, double timeout_s) {
  // c10d logs every failed store read with a C++ stack trace; pipetune reports failures itself,
  // once, naming the rank. A level the user set is kept.
  // (c10 read TORCH_CPP_LOG_LEVEL when it loaded: the flag itself is what can still change.)
  if (!std::getenv("TORCH_CPP_LOG_LEVEL"))
    FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);
  return std::make_shared<GlooTransport>(env, timeout_s);
}

#endif

}  // namespace pipetune::distributed

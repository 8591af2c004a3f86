#pragma once

// The seam between the pipeline and the other processes of a distributed run (distributed/
// implements it on torch.distributed's c10d). The pipeline only needs these few operations, so
// it stays one piece of code for one process and for many, and c10d's headers stay out of it.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pipetune::exec {

/// A tensor received from another rank, and when its sender posted it (ms on rank 0's clock).
struct Received {
  at::Tensor tensor;
  double sent_ms = 0.0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// How long a rank waits for another before it gives up on it, in seconds.
  virtual double timeout_s() const = 0;

  /// Rank 0's steady clock, in ms, read here: this rank's steady clock plus the offset measured
  /// through the store at connection (on one machine the offset is ~0: one clock).
  virtual double clock_ms() const = 0;
  /// What the alignment measured: rank 0's clock minus this rank's, and the round trip it came
  /// from (the offset's error is at most half of it).
  virtual double clock_offset_ms() const = 0;
  virtual double clock_round_trip_ms() const = 0;

  /// Posts a send and returns at once; the tensor is kept alive until flush_sends().
  /// `sent_ms` (rank 0's clock) travels with it.
  virtual void send(const at::Tensor& tensor, int to_rank, int tag, double sent_ms) = 0;
  /// Blocks until the tensor with `tag` from `from_rank` has arrived. Throws WorkError naming
  /// the rank when it died or did not send within the timeout.
  virtual Received recv(int from_rank, int tag) = 0;
  /// Wakes every recv blocked in this process, and any later one, with WorkError("cancelled"):
  /// the step was stopped or failed here, and what the peers would send is no longer wanted.
  virtual void cancel_receives() = 0;
  /// Waits until every posted send has been received (or throws WorkError, as recv).
  virtual void flush_sends() = 0;

  /// Every rank reaches this before any goes on (WorkError on timeout or a dead rank).
  virtual void barrier(const std::string& what) = 0;
  /// Called by a rank that failed, right before it exits. The others record that they failed;
  /// rank 0, which hosts the store, stays until every other rank has failed or stopped (at most
  /// the timeout), so they can still tell there which rank was at fault.
  virtual void leave_after_failure() = 0;

  /// Rank 0 gets every rank's `blob` (its own included), in rank order; the others get {}.
  virtual std::vector<std::string> gather(const std::string& key, const std::string& blob) = 0;
};

}  // namespace pipetune::exec

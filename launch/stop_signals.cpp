#include "launch/stop_signals.hpp"

namespace pipetune::launcher {

namespace {

// Written by the handler, read by the launcher's loop.
volatile sig_atomic_t g_last = 0;
volatile sig_atomic_t g_count = 0;

void on_stop_signal(int signal) {
  g_last = signal;
  g_count = g_count + 1;
}

}  // namespace

StopSignals::StopSignals() {
  g_last = 0;
  g_count = 0;
  for (int k = 0; k < 2; ++k) {
    sigaction(kSignals[k], nullptr, &original_[k]);
    if (original_[k].sa_handler == SIG_IGN) continue;  // stays ignored, as shells expect
    struct sigaction handler {};
    handler.sa_handler = on_stop_signal;
    sigemptyset(&handler.sa_mask);
    sigaction(kSignals[k], &handler, nullptr);
  }
}

StopSignals::~StopSignals() {
  for (int k = 0; k < 2; ++k) sigaction(kSignals[k], &original_[k], nullptr);
}

int StopSignals::count() {
  return g_count;
}
int StopSignals::last() {
  return g_last;
}

void StopSignals::restore_in_child() const {
  for (int k = 0; k < 2; ++k) sigaction(kSignals[k], &original_[k], nullptr);
}

}  // namespace pipetune::launcher

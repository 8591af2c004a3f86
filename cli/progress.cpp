#include "cli/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace pipetune::cli {

ProgressBar::ProgressBar(std::string unit)
    : unit_(std::move(unit)),
      enabled_(::isatty(STDERR_FILENO) == 1),
      started_(std::chrono::steady_clock::now()),
      last_draw_(started_ - std::chrono::seconds(1)) {}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::update(std::size_t done, std::size_t total, const std::string& note) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
  const double seconds = std::chrono::duration<double>(now - started_).count();
  std::string line = fmt::format("\r[{}{}] {}/{} {}  {:.1f} s", std::string(filled, '#'),
                                 std::string(kWidth - filled, '.'), done, total, unit_, seconds);
  if (done > 0 && done < total) {
    line += fmt::format("  (eta {:.0f} s)",
                        seconds / static_cast<double>(done) * static_cast<double>(total - done));
  }
  if (!note.empty()) line += "  " + note;
  std::fputs(line.c_str(), stderr);
  std::fputs("\x1b[K", stderr);  // clear what a longer previous line left
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_) {
    std::fputs("\r\x1b[K", stderr);
    std::fflush(stderr);
    drawn_ = false;
  }
}

namespace {
std::string phase_unit(const std::string& phase) {
  if (phase == "profile") return "profile: layers x sizes";
  if (phase == "plan") return "plan: configurations";
  return phase + ": steps";
}
}  // namespace

void PhaseProgress::operator()(const std::string& phase, std::size_t done, std::size_t total) {
  if (mode_ == "lines") {
    std::fprintf(stderr, "progress %s %zu %zu\n", phase.c_str(), done, total);
    return;
  }
  if (mode_ != "bar") return;
  if (phase != phase_) {
    if (bar_) bar_->finish();
    phase_ = phase;
    bar_ = std::make_unique<ProgressBar>(phase_unit(phase));
  }
  bar_->update(done, total);
}

void PhaseProgress::finish() {
  if (bar_) bar_->finish();
  bar_.reset();
}

std::string progress_mode(const std::string& flag) {
  return !flag.empty() ? flag : ::isatty(STDERR_FILENO) ? "bar" : "none";
}

}  // namespace pipetune::cli

#pragma once

// What the app needs to launch `pipetune run` and follow it, without a process: the command's
// contract is
//   pipetune run --model SPEC --plan PLAN.json --steps N --trace OUT.json --progress lines
// which prints "progress <done> <total>" on stderr after each step (warm-up steps included),
// exits 0 on success, and otherwise gives its reason on the last line of stderr.

#include <QByteArray>
#include <QString>
#include <QStringList>
#include <optional>
#include <string>

#include "sim/profile.hpp"

namespace pipetune::gui {

/// The model spec (e.g. "mlp:layers=8,width=1024") that `pipetune profile` writes into the
/// profile's meta as "model_spec"; nothing when the profile has none.
std::optional<QString> model_spec_from_meta(const std::string& meta_json);

/// What to run. The batch size, device kind and dtype come from the profile, so that the run
/// measures what the profile measured (the command has flags for them beyond the contract's).
struct RunRequest {
  QString model_spec;
  QString plan_path;
  int steps = 1;
  QString trace_path;
  std::int64_t batch_size = 0;  ///< 0: the command's default
  QString device;               ///< "cpu" or "cuda"; empty: the command's default
  QString dtype;                ///< "float32" or "float64"; empty: the command's default
};

/// The arguments of `pipetune run` for a request.
QStringList run_arguments(const RunRequest& request);

/// The request that reproduces `profile`'s setting (nothing when it has no model spec).
std::optional<RunRequest> run_request(const Profile& profile, const QString& plan_path, int steps,
                                      const QString& trace_path);

struct RunProgress {
  int done = 0;
  int total = 0;
  bool operator==(const RunProgress&) const = default;
};

/// "progress 3 10" → {3, 10}; anything else → nothing.
std::optional<RunProgress> parse_progress_line(const QString& line);

/// Reads a process's stderr as it arrives (lines may come in pieces) and keeps the latest
/// progress and the last line, which is the reason when the command fails.
class ProgressReader {
 public:
  /// True when the progress changed.
  bool feed(const QByteArray& chunk);
  /// The process ended: a last line without a newline counts too.
  bool finish();
  const std::optional<RunProgress>& progress() const { return progress_; }
  const QString& last_line() const { return last_line_; }

 private:
  bool take_line(const QString& line);
  QByteArray pending_;
  std::optional<RunProgress> progress_;
  QString last_line_;
};

/// Where the `pipetune` command is: $PIPETUNE_CLI (`env_value`) when set; else the build tree's
/// (build/cli/pipetune, two folders above build/gui/app/ where the app is built); else beside
/// the app (an install); else on PATH. Empty when it is nowhere.
QString locate_pipetune_cli(const QString& app_dir, const QString& env_value);

}  // namespace pipetune::gui

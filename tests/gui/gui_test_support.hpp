#pragma once

// What the GUI tests share: a Qt application on the offscreen platform, the shipped sample
// data, an output folder, and measured traces made by hand with known differences.

#include <QApplication>
#include <QDir>
#include <QEventLoop>
#include <QTimer>
#include <functional>
#include <string>

#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"

namespace pipetune::gui::testing {

/// The one QApplication of the test binary (offscreen unless QT_QPA_PLATFORM says otherwise).
inline QApplication& app() {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  static int argc = 1;
  static char name[] = "pipetune_gui_tests";
  static char* argv[] = {name, nullptr};
  static QApplication* application = new QApplication(argc, argv);  // lives to the end
  return *application;
}

inline std::string data_path(const std::string& name) {
  return std::string(PIPETUNE_SOURCE_DIR) + "/tests/data/" + name;
}

/// The test's output folder (made on first use).
inline QString output_dir() {
  const QString dir = QStringLiteral(PIPETUNE_GUI_TEST_OUTPUT_DIR);
  QDir().mkpath(dir);
  return dir;
}

/// Spins the event loop until `done` holds or `timeout_ms` passes; returns `done()`.
inline bool wait_until(const std::function<bool()>& done, int timeout_ms = 20000) {
  QEventLoop loop;
  QTimer poll, give_up;
  QObject::connect(&poll, &QTimer::timeout, &loop, [&] {
    if (done()) loop.quit();
  });
  QObject::connect(&give_up, &QTimer::timeout, &loop, &QEventLoop::quit);
  poll.start(5);
  give_up.setSingleShot(true);
  give_up.start(timeout_ms);
  if (!done()) loop.exec();
  return done();
}

/// A predicted simulation of `plan`, every task and memory curve recorded, on a fresh Simulator:
/// the independent truth the GUI's re-simulations are compared with.
inline SimulationResult simulate_directly(const Profile& profile, const Hardware& hardware,
                                          const Plan& plan) {
  const Simulator simulator(profile, hardware);
  return simulator.run(plan, SimulationOptions{});
}

/// A "measured" trace: the prediction of `profile` with every layer's times scaled (forward by
/// `forward_scale`, backward by `backward_scale`), shifted to start at `offset_ms`, as an
/// executor would record it. Its tasks follow the same schedule as the prediction of the
/// unscaled profile, so every task has a match.
inline Trace make_measured_trace(Profile profile, const Hardware& hardware, const Plan& plan,
                                 double forward_scale, double backward_scale, double offset_ms) {
  for (auto& layer : profile.layers) {
    for (auto& ms : layer.forward_ms) ms *= forward_scale;
    for (auto& ms : layer.backward_ms) ms *= backward_scale;
  }
  const Simulator simulator(profile, hardware);
  Trace trace = trace_from_simulation(simulator.run(plan), profile.model);
  trace.kind = "measured";
  for (auto& t : trace.tasks) t.start_ms += offset_ms, t.end_ms += offset_ms;
  for (auto& d : trace.devices) {
    for (auto& s : d.memory) s.time += offset_ms;
  }
  return trace;
}

}  // namespace pipetune::gui::testing

// pipetune-gui [profile.json] [hardware.json] [plan.json] [trace.json ...]
// pipetune-gui --screenshot FILE [files ...]: opens the files, renders the window to FILE, exits.
// --devices, --memory and --bandwidth edit the devices as `pipetune simulate`'s flags do.

#include <QApplication>
#include <QCommandLineParser>
#include <QMessageBox>
#include <QRegularExpression>
#include <QTimer>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "gui/model/text_format.hpp"
#include "gui/widgets/main_window.hpp"

namespace {

bool wants_screenshot(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--screenshot") == 0 ||
        std::strncmp(argv[i], "--screenshot=", 13) == 0) {
      return true;
    }
  }
  return false;
}

// The options besides the files: a screenshot and its size, and `pipetune simulate`'s device
// flags, applied to the opened profile.
struct Options {
  QCommandLineOption screenshot{QStringLiteral("screenshot"),
                                QStringLiteral("Render the main window to FILE and exit."),
                                QStringLiteral("FILE")};
  QCommandLineOption size{QStringLiteral("size"),
                          QStringLiteral("Window size for --screenshot (default 1600x1000)."),
                          QStringLiteral("WxH"), QStringLiteral("1600x1000")};
  QCommandLineOption devices{QStringLiteral("devices"),
                             QStringLiteral("N devices, one stage each (balanced)."),
                             QStringLiteral("N")};
  QCommandLineOption memory{QStringLiteral("memory"),
                            QStringLiteral("Memory of every device, e.g. 16GiB."),
                            QStringLiteral("SIZE")};
  QCommandLineOption bandwidth{QStringLiteral("bandwidth"),
                               QStringLiteral("Link bandwidth, e.g. 25GB/s or ideal."),
                               QStringLiteral("B")};
};

// The device flags given, applied to the editor; a flag refused adds to `problems`.
void apply_device_flags(const QCommandLineParser& parser, const Options& o,
                        pipetune::gui::PlanEditor& editor, QStringList& problems) {
  if (parser.isSet(o.devices)) {
    bool ok = false;
    const int count = parser.value(o.devices).toInt(&ok);
    const QString refused =
        ok ? editor.set_device_count(count) : QStringLiteral("expected a count");
    if (!refused.isEmpty()) problems << QStringLiteral("--devices: ") + refused;
  }
  if (parser.isSet(o.memory)) {
    const std::int64_t bytes = pipetune::gui::parse_size(parser.value(o.memory));
    if (bytes < 0 || !editor.has_profile()) {
      problems << QStringLiteral("--memory: expected a size such as 16GiB (and a profile)");
    } else {
      editor.set_memory_per_device(bytes);
    }
  }
  if (parser.isSet(o.bandwidth)) {
    const double bytes_per_s = pipetune::gui::parse_bandwidth(parser.value(o.bandwidth));
    if (std::isnan(bytes_per_s) || !editor.has_profile()) {
      problems << QStringLiteral(
          "--bandwidth: expected bytes per second such as 25GB/s or ideal (and a profile)");
    } else {
      editor.set_link_bandwidth(bytes_per_s);
    }
  }
}

// --screenshot: the window rendered to the file; 2 where a file or flag was refused, 1 where the
// image could not be written.
int save_screenshot(const QCommandLineParser& parser, const Options& o,
                    pipetune::gui::MainWindow& window, const QStringList& problems) {
  for (const QString& p : problems) std::fprintf(stderr, "pipetune-gui: %s\n", qPrintable(p));
  const auto match =
      QRegularExpression(QStringLiteral("^(\\d+)x(\\d+)$")).match(parser.value(o.size));
  if (!match.hasMatch()) {
    std::fprintf(stderr, "pipetune-gui: --size: expected WxH such as 1600x1000, got \"%s\"\n",
                 qPrintable(parser.value(o.size)));
    return 2;
  }
  const QSize window_size(match.captured(1).toInt(), match.captured(2).toInt());
  const QString failure = window.save_screenshot(parser.value(o.screenshot), window_size);
  if (!failure.isEmpty()) {
    std::fprintf(stderr, "pipetune-gui: %s\n", qPrintable(failure));
    return 1;
  }
  return problems.isEmpty() ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  // A screenshot needs no display: use the offscreen platform unless one was chosen.
  if (wants_screenshot(argc, argv) && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) {
    qputenv("QT_QPA_PLATFORM", "offscreen");
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("pipetune-gui"));
  QApplication::setOrganizationName(QStringLiteral("pipetune"));

  QCommandLineParser parser;
  parser.setApplicationDescription(
      QStringLiteral("Tune a GPipe plan interactively and compare its predicted timeline with a "
                     "measured one. Files: a profile, a hardware file, a plan and traces, in any "
                     "order."));
  parser.addHelpOption();
  const Options options;
  parser.addOptions(
      {options.screenshot, options.size, options.devices, options.memory, options.bandwidth});
  parser.addPositionalArgument(
      QStringLiteral("files"),
      QStringLiteral("profile.json, hardware.json, plan.json, trace.json ..."),
      QStringLiteral("[files...]"));
  parser.process(app);

  pipetune::gui::MainWindow window;
  QStringList problems = window.open_files(parser.positionalArguments());
  pipetune::gui::PlanEditor& editor = window.editor();
  apply_device_flags(parser, options, editor, problems);
  if (parser.isSet(options.screenshot)) return save_screenshot(parser, options, window, problems);

  window.resize(1600, 1000);
  window.show();
  if (!problems.isEmpty()) {
    QTimer::singleShot(0, &window, [&window, problems] {
      QMessageBox::warning(&window, QStringLiteral("pipetune"), problems.join(QLatin1Char('\n')));
    });
  }
  return QApplication::exec();
}

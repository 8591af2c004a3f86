#include "gui/model/text_format.hpp"

#include <cmath>
#include <limits>

#include "sim/limits.hpp"
#include "sim/plan.hpp"
#include "sim/units.hpp"

namespace pipetune::gui {

namespace {

// Three significant digits: 1.23, 12.3, 123.
QString three_digits(double value) {
  const double magnitude = std::fabs(value);
  const int decimals = magnitude >= 100 ? 0 : magnitude >= 10 ? 1 : 2;
  return QString::number(value, 'f', decimals);
}

}  // namespace

QString format_duration(double ms) {
  if (!std::isfinite(ms)) return QStringLiteral("—");
  const double magnitude = std::fabs(ms);
  if (magnitude >= 1000.0) return three_digits(ms / 1000.0) + QStringLiteral(" s");
  if (magnitude >= 1.0 || magnitude == 0.0) return three_digits(ms) + QStringLiteral(" ms");
  if (magnitude >= 1e-3) return three_digits(ms * 1e3) + QStringLiteral(" µs");
  return three_digits(ms * 1e6) + QStringLiteral(" ns");
}

QString format_tick(double ms, double step_ms) {
  if (std::fabs(ms) < step_ms * 1e-6) return QStringLiteral("0");
  double scale = 1.0;
  QString unit = QStringLiteral(" ms");
  // The unit follows the step: up to two decimals in ms before switching to µs.
  if (step_ms >= 1000.0) {
    scale = 1e-3, unit = QStringLiteral(" s");
  } else if (step_ms < 1e-5) {
    scale = 1e6, unit = QStringLiteral(" ns");
  } else if (step_ms < 1e-2) {
    scale = 1e3, unit = QStringLiteral(" µs");
  }
  const double step = step_ms * scale;
  // Decimals needed to write the step exactly (steps are 1, 2 or 5 times a power of ten).
  const int decimals = step >= 1.0 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return QString::number(ms * scale, 'f', decimals) + unit;
}

QString format_error(double fraction) {
  if (!std::isfinite(fraction)) return QStringLiteral("—");
  const double percent = fraction * 100.0;
  const QString digits =
      QString::number(std::fabs(percent), 'f', std::fabs(percent) >= 100 ? 0 : 1);
  if (digits.toDouble() == 0.0) return QStringLiteral("0.0 %");
  return (percent < 0 ? QStringLiteral("−") : QStringLiteral("+")) + digits + QStringLiteral(" %");
}

QString format_size(std::int64_t bytes, bool zero_is_unknown) {
  if (zero_is_unknown && bytes == 0) return QStringLiteral("—");
  return QString::fromStdString(format_bytes(bytes));
}

QString format_bandwidth(double bytes_per_s) {
  return QString::fromStdString(pipetune::format_bandwidth(bytes_per_s));
}

QString format_balance(const std::vector<int>& balance) {
  return QString::fromStdString(pipetune::format_balance(balance));
}

QString format_schedule(const Plan& plan) {
  QString text = QString::fromUtf8(to_string(plan.schedule).data());
  if (plan.stages_per_device != 1)
    text += QStringLiteral(", %1/device").arg(plan.stages_per_device);
  return text;
}

std::vector<int> parse_balance(const QString& text) {
  return pipetune::parse_balance(text.toStdString());
}

std::int64_t parse_size(const QString& text) {
  QString cleaned = text.trimmed().toLower();
  cleaned.remove(QLatin1Char(' '));
  if (cleaned == QLatin1String("unlimited") || cleaned == QLatin1String("unknown") ||
      cleaned == QLatin1String("—") || cleaned == QLatin1String("-")) {
    return 0;
  }
  const std::int64_t bytes = parse_bytes(cleaned.toStdString());
  return bytes > limits::kMaxBytes ? -1 : bytes;  // the hardware file's ceiling
}

double parse_bandwidth(const QString& text) {
  return pipetune::parse_bandwidth(text.toStdString());
}

}  // namespace pipetune::gui

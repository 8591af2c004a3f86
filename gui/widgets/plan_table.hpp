#pragma once

// The table of plans to click that the planner panel and the one-choice-away view share: rows
// selected whole, read-only, the first column stretched, a fixed height in the side panel.

#include <QStringList>

class QTableWidget;
class QWidget;

namespace pipetune::gui {

QTableWidget* make_plan_table(const QStringList& headers, QWidget* parent);

}  // namespace pipetune::gui

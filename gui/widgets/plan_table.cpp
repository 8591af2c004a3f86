#include "gui/widgets/plan_table.hpp"

#include <QHeaderView>
#include <QTableWidget>

namespace pipetune::gui {

QTableWidget* make_plan_table(const QStringList& headers, QWidget* parent) {
  auto* table = new QTableWidget(parent);
  table->setColumnCount(static_cast<int>(headers.size()));
  table->setHorizontalHeaderLabels(headers);
  table->verticalHeader()->hide();
  table->verticalHeader()->setDefaultSectionSize(table->fontMetrics().height() + 6);
  table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  table->setSelectionBehavior(QAbstractItemView::SelectRows);
  table->setSelectionMode(QAbstractItemView::SingleSelection);
  table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table->setFixedHeight(130);
  return table;
}

}  // namespace pipetune::gui

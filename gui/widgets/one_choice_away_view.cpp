#include "gui/widgets/one_choice_away_view.hpp"

#include <QLabel>
#include <QTableWidget>
#include <QVBoxLayout>

#include "gui/model/text_format.hpp"
#include "gui/widgets/plan_table.hpp"

namespace pipetune::gui {

OneChoiceAwayView::OneChoiceAwayView(PlanEditor& editor, QWidget* parent)
    : QWidget(parent),
      editor_(editor),
      status_(new QLabel(this)),
      table_(make_plan_table(
          {tr("change"), tr("iteration"), tr("time"), tr("max peak"), tr("memory"), tr("balance")},
          this)) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  status_->setWordWrap(true);
  status_->setStyleSheet(QStringLiteral("color: #4a525d;"));
  layout->addWidget(status_);
  layout->addWidget(table_);
  connect(table_, &QTableWidget::cellClicked, this, [this](int r, int) { pick(r); });
  connect(&editor_, &PlanEditor::profile_changed, this, &OneChoiceAwayView::clear);
  clear();
}

void OneChoiceAwayView::clear() {
  rows_.clear();
  table_->setRowCount(0);
  status_->setText(tr("After a search: the best plan with one choice changed, each re-planned."));
}

void OneChoiceAwayView::waiting() {
  rows_.clear();
  table_->setRowCount(0);
  status_->setText(tr("Re-planning the best plan with one choice changed…"));
}

void OneChoiceAwayView::show_alternatives(std::shared_ptr<const OneChoiceAway> away) {
  rows_ = one_choice_rows(*away);
  table_->setRowCount(static_cast<int>(rows_.size()));
  for (std::size_t k = 0; k < rows_.size(); ++k) {
    const OneChoiceRow& row = rows_[k];
    const QString cells[] = {row.change, row.iteration,     row.time_change,
                             row.peak,   row.memory_change, row.balance};
    for (int column = 0; column < 6; ++column) {
      auto* item = new QTableWidgetItem(cells[column]);
      const bool text_column = column == 0 || column == 5;
      item->setTextAlignment(text_column ? Qt::AlignLeft | Qt::AlignVCenter
                                         : Qt::AlignRight | Qt::AlignVCenter);
      item->setToolTip(row.change);  // the change column is narrow in the side panel
      table_->setItem(static_cast<int>(k), column, item);
    }
  }
  status_->setText(tr("Against the best plan, %1 (%2). Click a row to load it.")
                       .arg(QString::fromStdString(describe_plan(away->best.plan)).toHtmlEscaped(),
                            format_duration(away->best.iteration_ms)));
}

void OneChoiceAwayView::pick(int row) {
  if (row < 0 || row >= static_cast<int>(rows_.size()) || !rows_[row].plan) return;
  emit plan_picked(editor_.apply_plan(*rows_[row].plan));
}

}  // namespace pipetune::gui

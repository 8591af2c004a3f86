#include "sim/schedule_csv.hpp"

#include <fmt/format.h>

#include <optional>
#include <stdexcept>
#include <string_view>

#include "sim/error.hpp"
#include "sim/file_io.hpp"

namespace pipetune {

namespace {

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

// torch 2.11's other action types: valid in its IR, not in a compute-only schedule.
bool is_torch_communication(std::string_view cell) {
  for (std::string_view op :
       {"UNSHARD", "RESHARD", "REDUCE_GRAD", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}) {
    if (cell.find(op) != std::string_view::npos) return true;
  }
  return false;
}

// DualPipeV's paired cell, "(0F3;3B1)OVERLAP_F_B": torch's runtime runs the sub-actions one
// after the other, so they are that many actions here. Nothing when `cell` is not one.
constexpr std::string_view kOverlapSuffix = ")OVERLAP_F_B";
std::optional<std::string_view> overlap_body(std::string_view cell) {
  if (cell.size() < kOverlapSuffix.size() + 1 || cell.front() != '(' ||
      !cell.ends_with(kOverlapSuffix)) {
    return std::nullopt;
  }
  return cell.substr(1, cell.size() - 1 - kOverlapSuffix.size());
}

}  // namespace

Schedule parse_schedule_csv(std::string_view text, const std::string& source) {
  std::vector<std::vector<Action>> programs;
  std::vector<std::vector<std::size_t>> cell_of;  // per programme, the cell of each action
  std::size_t row = 0;
  while (!text.empty()) {
    const auto end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    ++row;
    programs.emplace_back();
    cell_of.emplace_back();
    std::size_t cell = 0;
    for (std::size_t begin = 0; begin <= line.size();) {
      const auto comma = line.find(',', begin);
      const std::string_view raw = line.substr(
          begin, comma == std::string_view::npos ? std::string_view::npos : comma - begin);
      begin = comma == std::string_view::npos ? line.size() + 1 : comma + 1;
      ++cell;
      const std::string_view content = trim(raw);
      if (content.empty()) continue;  // idle
      auto fail = [&](const std::string& expected) {
        throw InputError(fmt::format("{}: row {}, cell {}: expected {}, got \"{}\"", source, row,
                                     cell, expected, std::string(content)));
      };
      if (is_torch_communication(content)) {
        fail("a compute action (F, B, I or W): this is torch's compute-only format");
      }
      auto add = [&](std::string_view text) {
        const auto action = parse_action(trim(text));
        if (!action) fail("an action such as 2F0 (stage, F, B, I or W, micro-batch)");
        if (action->kind == ActionKind::Recompute) {
          fail("F, B, I or W (torch has no recompute action; checkpointing is the plan's)");
        }
        if (action->stage > 1'000'000 || action->micro_batch > 1'000'000) {
          fail("a stage and a micro-batch up to 1000000");
        }
        programs.back().push_back(*action);
        cell_of.back().push_back(cell);
      };
      if (const auto body = overlap_body(content)) {
        if (body->empty()) fail("sub-actions in (…)OVERLAP_F_B, such as (0F3;3B1)OVERLAP_F_B");
        for (std::size_t from = 0; from <= body->size();) {
          const auto semicolon = body->find(';', from);
          add(body->substr(from, semicolon == std::string_view::npos ? std::string_view::npos
                                                                     : semicolon - from));
          from = semicolon == std::string_view::npos ? body->size() + 1 : semicolon + 1;
        }
        continue;
      }
      if (content.find("OVERLAP_F_B") != std::string_view::npos) {
        fail("(sub-action;sub-action)OVERLAP_F_B, such as (0F3;3B1)OVERLAP_F_B");
      }
      add(content);
    }
  }
  if (programs.empty()) throw InputError(source + ": expected one row per rank, got no rows");
  try {
    return schedule_from_programs(std::move(programs), [&](std::size_t r, std::size_t k) {
      return fmt::format("row {}, cell {}", r + 1, cell_of[r][k]);
    });
  } catch (const std::invalid_argument& e) {
    throw InputError(fmt::format("{}: {}", source, e.what()));
  } catch (const std::logic_error& e) {
    throw InputError(fmt::format("{}: {}", source, e.what()));
  }
}

Schedule load_schedule_csv(const std::string& path) {
  return parse_schedule_csv(read_text_file(path), path);
}

std::string schedule_csv(const std::vector<std::vector<Action>>& programs, int* left_out) {
  std::string out;
  int recomputes = 0;
  for (const auto& program : programs) {
    std::string row;
    for (const Action& a : program) {
      if (a.kind == ActionKind::Recompute) {
        ++recomputes;
        continue;
      }
      if (!row.empty()) row += ',';
      row += to_string(a);
    }
    out += row + "\r\n";  // Python's csv writer ends rows with \r\n
  }
  if (left_out) *left_out = recomputes;
  return out;
}

}  // namespace pipetune

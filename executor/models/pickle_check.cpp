#include "executor/models/pickle_check.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>

namespace pipetune::models {

namespace {

// How an opcode's argument is laid out (Python's pickle protocols 0 to 5; pickletools names).
enum class Argument {
  None,
  Fixed,     // `size` bytes
  Counted,   // a little-endian count of `size` bytes, then that many bytes
  Line,      // bytes up to a newline
  TwoLines,  // GLOBAL and INST: module and name, each up to a newline
};

struct Opcode {
  Argument argument = Argument::None;
  int size = 0;
  enum class Memo { None, Put, Get, Memoize } memo = Memo::None;
};

std::optional<Opcode> opcode(unsigned char code) {
  using M = Opcode::Memo;
  switch (code) {
    // No argument.
    case '(':
    case '.':
    case '0':
    case '1':
    case '2':
    case 'N':
    case 0x88:
    case 0x89:
    case '}':
    case ']':
    case ')':
    case 'a':
    case 'e':
    case 's':
    case 'u':
    case 't':
    case 0x85:
    case 0x86:
    case 0x87:
    case 'R':
    case 'b':
    case 'Q':
    case 'l':
    case 'd':
    case 0x81:
    case 0x92:
    case 0x8f:
    case 0x90:
    case 0x91:
    case 0x93:
    case 0x97:
    case 0x98:
      return Opcode{};
    case 0x94:  // MEMOIZE
      return Opcode{Argument::None, 0, M::Memoize};
    // Fixed-size arguments.
    case 'K':
    case 0x80:
    case 0x82:  // BININT1, PROTO, EXT1
      return Opcode{Argument::Fixed, 1};
    case 'M':
    case 0x83:  // BININT2, EXT2
      return Opcode{Argument::Fixed, 2};
    case 'J':
    case 0x84:  // BININT, EXT4
      return Opcode{Argument::Fixed, 4};
    case 'G':
    case 0x95:  // BINFLOAT, FRAME (a frame's opcodes follow inline)
      return Opcode{Argument::Fixed, 8};
    case 'q':  // BINPUT
      return Opcode{Argument::Fixed, 1, M::Put};
    case 'r':  // LONG_BINPUT
      return Opcode{Argument::Fixed, 4, M::Put};
    case 'h':  // BINGET
      return Opcode{Argument::Fixed, 1, M::Get};
    case 'j':  // LONG_BINGET
      return Opcode{Argument::Fixed, 4, M::Get};
    // Counted data.
    case 'U':
    case 0x8c:
    case 'C':
    case 0x8a:  // SHORT_BINSTRING, SHORT_BINUNICODE, SHORT_BINBYTES, LONG1
      return Opcode{Argument::Counted, 1};
    case 'T':
    case 'X':
    case 'B':
    case 0x8b:  // BINSTRING, BINUNICODE, BINBYTES, LONG4
      return Opcode{Argument::Counted, 4};
    case 0x8d:
    case 0x8e:
    case 0x96:  // BINUNICODE8, BINBYTES8, BYTEARRAY8
      return Opcode{Argument::Counted, 8};
    // Text arguments (protocol 0).
    case 'I':
    case 'L':
    case 'F':
    case 'S':
    case 'V':
    case 'P':
      return Opcode{Argument::Line, 0};
    case 'p':  // PUT
      return Opcode{Argument::Line, 0, M::Put};
    case 'g':  // GET
      return Opcode{Argument::Line, 0, M::Get};
    case 'c':
    case 'i':  // GLOBAL, INST
      return Opcode{Argument::TwoLines, 0};
    default:
      return std::nullopt;
  }
}

std::uint64_t little_endian(std::string_view bytes) {
  std::uint64_t value = 0;
  for (std::size_t k = bytes.size(); k-- > 0;) {
    value = (value << 8) | static_cast<unsigned char>(bytes[k]);
  }
  return value;
}

}  // namespace

std::optional<std::string> pickle_refusal(std::string_view pickle) {
  std::size_t at = 0;
  std::uint64_t memo_entries = 0;  // entries the pickle has set so far, numbered from 0
  while (at < pickle.size()) {
    const std::size_t start = at;
    const auto code = static_cast<unsigned char>(pickle[at++]);
    const auto op = opcode(code);
    if (!op) return fmt::format("unknown pickle opcode 0x{:02x} at byte {}", code, start);
    const std::size_t left = pickle.size() - at;
    auto past_end = [&] {
      return fmt::format("pickle opcode 0x{:02x} at byte {} runs past the end ({} bytes left)",
                         code, start, left);
    };
    std::string_view argument;
    switch (op->argument) {
      case Argument::None:
        break;
      case Argument::Fixed:
        if (left < static_cast<std::size_t>(op->size)) return past_end();
        argument = pickle.substr(at, op->size);
        at += op->size;
        break;
      case Argument::Counted: {
        if (left < static_cast<std::size_t>(op->size)) return past_end();
        const std::uint64_t count = little_endian(pickle.substr(at, op->size));
        if (count > left - op->size) {
          return fmt::format(
              "pickle opcode 0x{:02x} at byte {} announces {} bytes, but {} are left", code, start,
              count, left - op->size);
        }
        at += op->size + count;
        break;
      }
      case Argument::Line:
      case Argument::TwoLines: {
        const int lines = op->argument == Argument::Line ? 1 : 2;
        for (int k = 0; k < lines; ++k) {
          const auto newline = pickle.find('\n', at);
          if (newline == std::string_view::npos) return past_end();
          if (k == 0) argument = pickle.substr(at, newline - at);
          at = newline + 1;
        }
        break;
      }
    }
    if (op->memo != Opcode::Memo::None) {
      std::uint64_t index = memo_entries;  // MEMOIZE takes the next one
      if (op->memo != Opcode::Memo::Memoize) {
        if (op->argument == Argument::Fixed) {
          index = little_endian(argument);
        } else {
          auto [end, error] =
              std::from_chars(argument.data(), argument.data() + argument.size(), index);
          if (error != std::errc() || end != argument.data() + argument.size()) {
            return fmt::format("pickle memo index \"{}\" at byte {} is not a number",
                               std::string(argument.substr(0, 20)), start);
          }
        }
      }
      // A pickler numbers its memo entries in order: a put sets the next one (or an earlier
      // one again), a get reads one already set.
      const bool in_order =
          op->memo == Opcode::Memo::Get ? index < memo_entries : index <= memo_entries;
      if (!in_order) {
        return fmt::format("pickle memo index {} at byte {} is out of order ({} set so far)", index,
                           start, memo_entries);
      }
      if (op->memo != Opcode::Memo::Get && index == memo_entries) ++memo_entries;
    }
    if (code == '.') return std::nullopt;  // STOP: the unpickler reads no further
  }
  return fmt::format("the pickle ends after {} bytes without its STOP opcode", pickle.size());
}

}  // namespace pipetune::models

// INI text and command-line overrides into a Config. Boost.ProgramOptions parses both against an
// options_description built from the key table; this file turns its errors into ours (file, line, key, what the value
// must look like) and refuses what it would accept silently.
#include "config_ini.h"

#include <boost/program_options.hpp>
#include <sstream>

#include "config_keys.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/core/small_file.h"

namespace po = boost::program_options;

namespace st {
namespace config_internal {
namespace {

// Boost's own messages quote the offending token: room for the text around it and an excerpt's worth of the token.
constexpr size_t kBoostMessageChars = 2 * kExcerptChars;

// The hint after "unknown key 'x.y'": what the section does hold, or that there is no such section.
std::string unknown_key_hint(const std::string& full_name) {
  const auto dot = full_name.find('.');
  if (dot == std::string::npos) {
    return "every key belongs to a section: [section] in a file, --section.key on the command line; sections: " +
           section_list();
  }
  const std::string section = full_name.substr(0, dot);
  if (!is_section(section)) return "no section [" + excerpt(section) + "]; sections: " + section_list();
  std::string names;
  for (const Key* k : keys_in(section)) names += (names.empty() ? "" : ", ") + std::string(k->name);
  if (names.empty()) return "section [" + section + "] has no keys in this version";
  return "keys of [" + section + "]: " + names;
}

po::options_description describe(Config& cfg) {
  po::options_description desc("shardtrain config");
  for (const auto& k : keys()) k.field->add_to(desc, k.full_name(), k.description, cfg);
  return desc;
}

// ---------------------------------------------------------------------------------------------------
// INI text. Boost reads the file; this scanner mirrors its grammar only to report line numbers and to
// refuse unknown or empty sections, which Boost accepts silently when no key follows them.

struct IniLine {
  enum class Kind { kBlank, kSection, kKey, kMalformed };
  int number = 0;
  Kind kind = Kind::kBlank;
  std::string text;  // the line without its comment, trimmed
  std::string name;  // section name, or section.key as Boost will see it
};

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::vector<IniLine> scan_ini(const std::string& text) {
  std::vector<IniLine> out;
  std::istringstream in(text);
  std::string raw;
  std::string prefix;
  int number = 0;
  while (std::getline(in, raw)) {
    IniLine line;
    line.number = ++number;
    line.text = trim(raw.substr(0, raw.find('#')));
    if (line.text.empty()) {
      line.kind = IniLine::Kind::kBlank;
    } else if (line.text.front() == '[' && line.text.back() == ']') {
      line.kind = IniLine::Kind::kSection;
      line.name = line.text.substr(1, line.text.size() - 2);
      prefix = line.name.empty() || line.name.back() != '.' ? line.name + "." : line.name;
    } else if (const auto eq = line.text.find('='); eq != std::string::npos) {
      line.kind = IniLine::Kind::kKey;
      line.name = prefix + trim(line.text.substr(0, eq));
    } else {
      line.kind = IniLine::Kind::kMalformed;
    }
    out.push_back(std::move(line));
  }
  return out;
}

std::vector<int> lines_of_key(const std::vector<IniLine>& lines, const std::string& full_name) {
  std::vector<int> out;
  for (const auto& l : lines)
    if (l.kind == IniLine::Kind::kKey && l.name == full_name) out.push_back(l.number);
  return out;
}

// Boost names command-line options as typed ("--train.stepz=5"); we name keys as written in INI.
std::string bare_key(std::string name) {
  name.erase(0, name.find_first_not_of('-'));
  return name.substr(0, name.find('='));
}

std::vector<std::string> raw_values(const po::parsed_options& parsed, const std::string& full_name) {
  std::vector<std::string> out;
  for (const auto& opt : parsed.options)
    if (opt.string_key == full_name) out.push_back(opt.value.empty() ? std::string() : opt.value.front());
  return out;
}

// Where a parse happens: a file (with its lines, for line numbers) or the command line.
struct Source {
  std::string label;                  // "config file configs/x.ini" or "command line"
  const std::vector<IniLine>* lines;  // null for the command line

  // "config file x.ini:3" for the first line that sets `full_name`, else just the label.
  std::string at(const std::string& full_name) const {
    if (lines == nullptr) return label;
    const auto found = lines_of_key(*lines, full_name);
    return found.empty() ? label : label + ":" + std::to_string(found.front());
  }
};

[[noreturn]] void throw_bad_value(const Source& src, const std::string& full_name, const std::string& raw) {
  const Key* k = find_key(full_name);
  ST_BAD_INPUT(src.at(full_name), ": bad value '", excerpt(raw), "' for ", excerpt(full_name), " (",
               (k != nullptr ? k->field->why_bad(raw) : std::string("expected a valid value")), ")");
}

// Stores `parsed` into the fields bound in its description, turning Boost's errors into ours, and records each key
// it sets in `set` as set by `origin`.
void store_into_config(const po::parsed_options& parsed, const Source& src, const std::string& origin,
                       ExplicitKeys& set) {
  for (const auto& opt : parsed.options) {
    const Key* k = find_key(opt.string_key);
    const std::string raw = opt.value.empty() ? std::string() : opt.value.front();
    if (k != nullptr && k->field->rejects(raw)) throw_bad_value(src, opt.string_key, raw);
  }
  po::variables_map vm;
  try {
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::multiple_occurrences& e) {
    const std::string name = bare_key(e.get_option_name());
    std::string where;
    if (src.lines != nullptr) {
      for (int line : lines_of_key(*src.lines, name)) where += (where.empty() ? "lines " : ", ") + std::to_string(line);
    } else {
      for (const auto& v : raw_values(parsed, name)) where += (where.empty() ? "values '" : "', '") + excerpt(v);
      where += "'";
    }
    ST_BAD_INPUT(src.label, ": ", excerpt(name), " is set more than once (", where, ")");
  } catch (const po::validation_error& e) {
    const std::string name = bare_key(e.get_option_name());
    const auto values = raw_values(parsed, name);
    throw_bad_value(src, name, values.empty() ? std::string() : values.front());
  } catch (const po::error& e) {
    ST_BAD_INPUT(src.label, ": ", excerpt(e.what(), kBoostMessageChars));
  }
  for (const auto& opt : parsed.options)
    if (!opt.string_key.empty()) set[opt.string_key] = origin;
}

// `label` names the text in errors: "config file PATH", or where else the INI came from.
void apply_text(const std::string& text, const std::string& label, const std::string& origin,
                const po::options_description& desc, ExplicitKeys& set) {
  const std::vector<IniLine> lines = scan_ini(text);
  const Source src{label, &lines};
  for (const auto& l : lines) {
    const std::string at = src.label + ":" + std::to_string(l.number);
    if (l.kind == IniLine::Kind::kMalformed)
      ST_BAD_INPUT(at, ": malformed line '", excerpt(l.text), "' (expected [section], key = value, or a # comment)");
    if (l.kind == IniLine::Kind::kSection && !is_section(l.name))
      ST_BAD_INPUT(at, ": unknown section [", excerpt(l.name), "] (sections: ", section_list(), ")");
  }

  std::istringstream in(text);
  std::optional<po::parsed_options> parsed;
  try {
    parsed.emplace(po::parse_config_file(in, desc, /*allow_unregistered=*/false));
  } catch (const po::unknown_option& e) {
    const std::string name = bare_key(e.get_option_name());
    ST_BAD_INPUT(src.at(name), ": unknown key '", excerpt(name), "' (", unknown_key_hint(name), ")");
  } catch (const po::invalid_config_file_syntax& e) {
    // scan_ini() should have caught it first; keep Boost's text, which quotes the line.
    ST_BAD_INPUT(src.label, ": malformed line: ", excerpt(e.what(), kBoostMessageChars));
  } catch (const po::error& e) {
    ST_BAD_INPUT(src.label, ": ", excerpt(e.what(), kBoostMessageChars));
  }
  store_into_config(*parsed, src, origin, set);
}

void apply_overrides(const std::vector<std::string>& overrides, const po::options_description& desc,
                     ExplicitKeys& set) {
  const Source src{"command line", nullptr};
  // Long options only, never guessed from a prefix: --train.step must not silently mean --train.steps.
  const int style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                    po::command_line_style::long_allow_next;
  // Boost refuses "--key=" (an empty adjacent value); "--log.metrics=" is how one clears a string key, so
  // hand it over as "--key" "" instead.
  std::vector<std::string> args;
  for (const auto& arg : overrides) {
    if (arg.size() > 3 && arg.compare(0, 2, "--") == 0 && arg.find('=') == arg.size() - 1) {
      args.push_back(arg.substr(0, arg.size() - 1));
      args.emplace_back();
    } else {
      args.push_back(arg);
    }
  }
  std::optional<po::parsed_options> parsed;
  try {
    parsed.emplace(po::command_line_parser(args).options(desc).style(style).run());
  } catch (const po::unknown_option& e) {
    const std::string name = bare_key(e.get_option_name());
    ST_BAD_INPUT(src.label, ": unknown key '", excerpt(name), "' in '", excerpt(e.get_option_name()), "' (",
                 unknown_key_hint(name), ")");
  } catch (const po::invalid_command_line_syntax& e) {
    const std::string name = bare_key(e.get_option_name());
    const std::string usage = "write --" + (name.empty() ? std::string("section.key") : excerpt(name)) + "=VALUE";
    if (e.kind() == po::invalid_command_line_syntax::missing_parameter)
      ST_BAD_INPUT(src.label, ": ", excerpt(name), " needs a value (", usage, ")");
    ST_BAD_INPUT(src.label, ": ", excerpt(e.what(), kBoostMessageChars), " (", usage, ")");
  } catch (const po::error& e) {
    ST_BAD_INPUT(src.label, ": ", excerpt(e.what(), kBoostMessageChars), " (overrides are --section.key=value)");
  }
  // Boost keeps words that are not options as positional arguments and store() drops them silently.
  for (const auto& opt : parsed->options) {
    if (opt.string_key.empty()) {
      const std::string word = opt.original_tokens.empty() ? std::string() : opt.original_tokens.front();
      ST_BAD_INPUT(src.label, ": unexpected argument '", excerpt(word), "' (overrides are --section.key=value)");
    }
  }
  store_into_config(*parsed, src, "the command line", set);
}

}  // namespace

std::string read_config_file(const std::string& path) {
  return read_small_file(path, {"config file '" + excerpt(path, kExcerptPathChars) + "'", "a config file",
                                kMaxConfigBytes, "(a config must be one: write it to a file)"});
}

ExplicitKeys parse_into(Config& cfg, const std::optional<std::string>& ini_text, const std::string& label,
                        const std::string& origin, const std::vector<std::string>& overrides) {
  // The description holds pointers into cfg; it must not outlive this call.
  const po::options_description desc = describe(cfg);
  ExplicitKeys set;
  if (ini_text) apply_text(*ini_text, label, origin, desc, set);
  if (!overrides.empty()) apply_overrides(overrides, desc, set);
  return set;
}

}  // namespace config_internal

using config_internal::Key;
using config_internal::keys_in;
using config_internal::kSections;

std::string to_ini(const Config& cfg) {
  std::ostringstream os;
  os << "# shardtrain config: every key with its value\n";
  for (const char* section : kSections) {
    os << "\n[" << section << "]\n";
    const std::vector<const Key*> in_section = keys_in(section);
    for (const Key* k : in_section) {
      const std::string value = k->field->format(cfg);
      os << k->name << " =" << (value.empty() ? "" : " ") << value << "\n";
    }
    if (in_section.empty()) os << "# no keys in this version\n";
  }
  return os.str();
}

}  // namespace st

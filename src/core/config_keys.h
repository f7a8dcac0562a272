// Private to src/core: the table of config keys. Each entry names a key's section and name, binds the Config field
// it sets (by pointer-to-member) and describes the key; this is the only description of a key. Parsing and
// to_ini() (config_ini.cc), validation (config_validate.cc), `shardtrain --help` and docs/config.md (config_help.cc)
// all read the table. A key whose field is an enum takes the names of that enum's EnumNames table (core/enum_names.h,
// beside the enum in config.h): adding an enum-valued key is the enum with its table, the field, and the key here.
#pragma once

#include <boost/program_options.hpp>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"

namespace st::config_internal {

// The INI sections, in the order help, docs/config.md and to_ini() list them.
inline constexpr const char* kSections[] = {"model", "train", "optim", "data", "ckpt", "init", "lora", "log", "dist"};

// One key's binding to its Config field, whatever the field's type.
class Field {
 public:
  virtual ~Field() = default;
  // Registers `key` in `desc`; Boost writes the parsed value into this key's field of `cfg` on notify().
  virtual void add_to(boost::program_options::options_description& desc, const std::string& key,
                      const char* description, Config& cfg) const = 0;
  // The field's value in `cfg` as INI text (to_ini() writes it, help shows the default).
  virtual std::string format(const Config& cfg) const = 0;
  // Sets this key's field of `to` to its value in `from`.
  virtual void copy(const Config& from, Config& to) const = 0;
  // What a value must look like: "an integer", "one of: cpu, cuda", ... (errors, help, docs/config.md).
  virtual std::string expected() const = 0;
  // The names an enum-valued key takes, in its EnumNames table's order (enum_names.h); empty for other keys.
  virtual std::vector<std::string> choices() const = 0;
  // Texts Boost would take but we do not: an empty value for a non-string (Boost reads an empty bool
  // as true), a negative unsigned (Boost wraps -1 to 2^64-1), and inf or nan for a floating-point key.
  virtual bool rejects(const std::string& raw) const = 0;
  // Why `raw` is no value of this key, for "bad value ... (WHY)": "out of range [MIN, MAX]" for a number the type
  // cannot hold (an int past 2^31 - 1, a float past 3.4e38), else "expected " and what a value must look like.
  virtual std::string why_bad(const std::string& raw) const = 0;
};

struct Key {
  const char* section;
  const char* name;
  const char* description;
  std::shared_ptr<const Field> field;

  std::string full_name() const { return std::string(section) + "." + name; }
};

// Every key, grouped by section in kSections order.
const std::vector<Key>& keys();
// The keys of one section, in table order (empty for a section without keys).
std::vector<const Key*> keys_in(const std::string& section);
// The key "section.name", or null.
const Key* find_key(const std::string& full_name);
bool is_section(const std::string& name);
// "model, train, ...": the sections for error messages.
std::string section_list();

// The shortest decimal text that reads back (through the same parser Boost uses) to exactly `v`, so to_ini()
// round-trips and help shows 0.001 rather than 0.00100000005; a whole number prints as one (600, not 6e+02).
std::string format_number(float v);
std::string format_number(double v);

}  // namespace st::config_internal

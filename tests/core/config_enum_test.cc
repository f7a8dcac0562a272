// Every enum-valued config key is driven by its enum's EnumNames table (core/enum_names.h): parsing, to_string(),
// the refusal of a name outside the table and the choices that help and docs/config.md list all come from it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "../../src/core/config_ini.h"
#include "../../src/core/config_keys.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/enum_names.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

namespace fs = std::filesystem;

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The enum-valued keys: those whose field lists choices.
std::vector<const config_internal::Key*> enum_keys() {
  std::vector<const config_internal::Key*> out;
  for (const config_internal::Key& k : config_internal::keys())
    if (!k.field->choices().empty()) out.push_back(&k);
  return out;
}

TEST(ConfigEnum, EveryEnumKeyListsItsTable) {
  const std::vector<const config_internal::Key*> keys = enum_keys();
  EXPECT_EQ(keys.size(), 17u);  // two of them (dist.gather_engine, dist.reduce_engine) share CommEngine's table
  for (const config_internal::Key* k : keys) {
    const std::vector<std::string> names = k->field->choices();
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size()) << k->full_name();
    EXPECT_EQ(k->field->expected(), "one of: " + joined(names)) << k->full_name();
    EXPECT_EQ(k->field->why_bad("not-a-name"), "expected one of: " + joined(names)) << k->full_name();
  }
  // The table's order is the listed order.
  const config_internal::Key* dtype = config_internal::find_key("train.dtype");
  ASSERT_NE(dtype, nullptr);
  EXPECT_EQ(dtype->field->choices(), (std::vector<std::string>{"auto", "fp32", "bf16", "fp16"}));
  EXPECT_EQ(enum_name_list<DType>(), "auto, fp32, bf16, fp16");
}

// Each name parses to a value whose to_string() (which to_ini() and help print) is that name again.
TEST(ConfigEnum, EveryNameParsesAndPrintsBackAsItself) {
  int names_checked = 0;
  for (const config_internal::Key* k : enum_keys()) {
    for (const std::string& name : k->field->choices()) {
      Config cfg;
      // parse_into alone: a name may be refused later by a cross-key check (optimizer+params on cpu), not by parsing.
      config_internal::parse_into(cfg, std::string("[") + k->section + "]\n" + k->name + " = " + name + "\n",
                                  "test ini", "test ini", {});
      EXPECT_EQ(k->field->format(cfg), name) << k->full_name();
      Config from_command_line;
      config_internal::parse_into(from_command_line, std::nullopt, "", "", {"--" + k->full_name() + "=" + name});
      EXPECT_EQ(k->field->format(from_command_line), name) << k->full_name();
      ++names_checked;
    }
  }
  EXPECT_EQ(names_checked, 46);
  EXPECT_STREQ(to_string(OffloadMode::kOptimizerParams), "optimizer+params");
  EXPECT_STREQ(to_string(Speculation::kOn), "true");
  EXPECT_STREQ(to_string(static_cast<DType>(99)), "?");
  EXPECT_EQ(enum_from_name<CommEngine>("copy"), CommEngine::kCopy);
  EXPECT_EQ(enum_from_name<CommEngine>("Copy"), std::nullopt);  // names are case-sensitive
}

// A name outside the table is refused naming the file, line and key, the value, and exactly the table's names.
TEST(ConfigEnum, ANameOutsideTheTableIsRefusedWithTheTablesNames) {
  std::string pattern = (fs::temp_directory_path() / "shardtrain_config_enum_test.XXXXXX").string();
  ASSERT_NE(mkdtemp(pattern.data()), nullptr);
  const fs::path dir = pattern;
  for (const config_internal::Key* k : enum_keys()) {
    const std::string path = (dir / "bad.ini").string();
    std::ofstream(path) << "# an enum key with a value of no enum\n[" << k->section << "]\n" << k->name << " = nope\n";
    std::string msg;
    try {
      load_config(path, {});
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      msg = e.what();
    }
    EXPECT_NE(msg.find(path + ":3: bad value 'nope' for " + k->full_name() +
                       " (expected one of: " + joined(k->field->choices()) + ")"),
              std::string::npos)
        << msg;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace st

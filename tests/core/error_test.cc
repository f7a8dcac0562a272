#include "shardtrain/core/error.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "../common/caught.h"

namespace st {
namespace {

using ::st::testing::caught;

TEST(ErrorTest, EnforceEqPrintsBothValues) {
  const int64_t rows = 3072;
  const int64_t cols = 768;
  const Error e = caught([&] { ST_ENFORCE_EQ(rows, cols); });
  EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  const std::string msg = e.what();
  EXPECT_NE(msg.find("rows = 3072"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cols = 768"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rows == cols"), std::string::npos) << msg;
  EXPECT_NE(msg.find("error_test.cc:"), std::string::npos) << msg;
  EXPECT_NO_THROW(ST_ENFORCE_EQ(rows, int64_t{3072}));
}

TEST(ErrorTest, EnforceComparisonsFailOnlyWhenFalse) {
  EXPECT_NO_THROW(ST_ENFORCE_LT(1, 2));
  EXPECT_NO_THROW(ST_ENFORCE_LE(2, 2));
  EXPECT_NO_THROW(ST_ENFORCE_GT(3, 2));
  EXPECT_NO_THROW(ST_ENFORCE_GE(2, 2));
  EXPECT_NO_THROW(ST_ENFORCE_NE(1, 2));
  const std::string msg = caught([] { ST_ENFORCE_LT(5, 4); }).what();
  EXPECT_NE(msg.find("5 = 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 = 4"), std::string::npos) << msg;
}

TEST(ErrorTest, CheckCarriesExpressionAndDetail) {
  const int n = 0;
  const Error e = caught([&] { ST_CHECK(n > 0, "empty batch of ", n); });
  EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  const std::string msg = e.what();
  EXPECT_NE(msg.find("check failed: n > 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("empty batch of 0"), std::string::npos) << msg;
}

TEST(ErrorTest, BadInputAndFaultKinds) {
  const Error bad = caught([] { ST_BAD_INPUT("data file ", "x.bin", ": token ", 70000, " >= vocab_size ", 50257); });
  EXPECT_EQ(bad.kind(), ErrorKind::kBadInput);
  const std::string msg = bad.what();
  EXPECT_NE(msg.find("data file x.bin: token 70000 >= vocab_size 50257"), std::string::npos) << msg;
  // A user-facing message carries no file:line noise: the process identity, then the message as given.
  EXPECT_EQ(msg, process_prefix() + " data file x.bin: token 70000 >= vocab_size 50257");
  // The same message through the one funnel, with no file.
  const Error direct = caught([] { detail::fail(ErrorKind::kBadInput, nullptr, 0, nullptr, "key x: expected 1"); });
  EXPECT_EQ(direct.kind(), ErrorKind::kBadInput);
  EXPECT_EQ(std::string(direct.what()), process_prefix() + " key x: expected 1");

  const Error fault = caught([] { ST_FAULT("peer ", 3, " died"); });
  EXPECT_EQ(fault.kind(), ErrorKind::kFault);
  EXPECT_NE(std::string(fault.what()).find("peer 3 died"), std::string::npos) << fault.what();
}

TEST(ErrorTest, ExitCodesPerKind) {
  EXPECT_EQ(exit_code_for(ErrorKind::kInternal), kExitInternal);
  EXPECT_EQ(exit_code_for(ErrorKind::kBadInput), kExitBadInput);
  EXPECT_EQ(exit_code_for(ErrorKind::kFault), kExitFault);
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitInternal, 1);
  EXPECT_EQ(kExitBadInput, 2);
  EXPECT_EQ(kExitFault, 75);
}

TEST(ErrorTest, StrCatConcatenates) { EXPECT_EQ(str_cat("a", 1, '-', 2.5, std::string("z")), "a1-2.5z"); }

}  // namespace
}  // namespace st

// A Completion fed a fake token stream (each id's text given, an id that leaves a character unfinished until the next
// one): end tokens end it without their text, stop strings cut the text before them, holding back what could start
// one, and what it prints piece by piece is its text; ids only without a stream.
#include "shardtrain/text/completion.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {
namespace {

// Token t's text is kText[t]; token 9 is the first half of a character whose second half is token 10: 9 alone is
// held, and finish() gives "?" for it.
const std::map<int32_t, std::string> kText = {{0, "Hello"}, {1, ","}, {2, " wor"},  {3, "ld"}, {4, "\n"},
                                              {5, "###"},   {6, "#"}, {7, "<end>"}, {8, "!"},  {10, "\xC3\xA9"}};

class FakeStream final : public TextStream {
 public:
  std::string push(int32_t id) override {
    if (id == 9) {
      held_ = true;
      return "";
    }
    held_ = false;
    return kText.at(id);
  }
  std::string finish() override {
    const bool h = held_;
    held_ = false;
    return h ? "?" : "";
  }

 private:
  bool held_ = false;
};

struct Fed {
  std::vector<std::string> pieces;  // push()'s, then finish()'s
  Completion completion;
};

// Pushes `ids` until the completion finishes; finish() after the last.
Fed feed(const std::vector<int32_t>& ids, std::vector<int32_t> ends, std::vector<std::string> stops) {
  Fed r{{}, Completion(std::make_unique<FakeStream>(), std::move(ends), std::move(stops))};
  for (int32_t id : ids) {
    if (r.completion.finished()) break;
    r.pieces.push_back(r.completion.push(id));
  }
  r.pieces.push_back(r.completion.finish());
  return r;
}

using Pieces = std::vector<std::string>;

TEST(Completion, UsingEveryTokenIsLength) {
  const Fed r = feed({0, 1, 2, 3}, {7}, {});
  EXPECT_EQ(r.pieces, (Pieces{"Hello", ",", " wor", "ld", ""}));
  EXPECT_EQ(r.completion.text(), "Hello, world");
  EXPECT_EQ(r.completion.ids(), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(r.completion.finish_reason(), FinishReason::kLength);
  EXPECT_STREQ(to_string(r.completion.finish_reason()), "length");
}

TEST(Completion, AnEndTokenEndsItUnprintedAndKeepsItsId) {
  const Fed r = feed({0, 7, 1}, {7}, {});
  EXPECT_EQ(r.pieces, (Pieces{"Hello", "", ""}));
  EXPECT_EQ(r.completion.text(), "Hello");
  EXPECT_EQ(r.completion.ids(), (std::vector<int32_t>{0, 7}));
  EXPECT_EQ(r.completion.finish_reason(), FinishReason::kStop);
  EXPECT_STREQ(to_string(r.completion.finish_reason()), "stop");
  // The stream's unfinished character is flushed when the end token comes.
  EXPECT_EQ(feed({0, 9, 7}, {7}, {}).completion.text(), "Hello?");
}

TEST(Completion, AStopStringCutsTheTextAndHoldsBackItsPossibleStart) {
  // "###" over tokens 6, 6, 6: each "#" is held until the third completes the stop.
  Fed r = feed({0, 6, 6, 6, 2}, {}, {"###"});
  EXPECT_EQ(r.pieces, (Pieces{"Hello", "", "", "", ""}));
  EXPECT_EQ(r.completion.text(), "Hello");
  EXPECT_EQ(r.completion.ids(), (std::vector<int32_t>{0, 6, 6, 6}));
  EXPECT_EQ(r.completion.finish_reason(), FinishReason::kStop);
  // Two "#" then " wor": released together once the stop is ruled out.
  r = feed({0, 6, 6, 2, 3}, {}, {"###"});
  EXPECT_EQ(r.pieces, (Pieces{"Hello", "", "", "## wor", "ld", ""}));
  EXPECT_EQ(r.completion.finish_reason(), FinishReason::kLength);
  // Held at the end: finish() releases it.
  r = feed({0, 6}, {}, {"###"});
  EXPECT_EQ(r.pieces, (Pieces{"Hello", "", "#"}));
  EXPECT_EQ(r.completion.text(), "Hello#");
  // A stop inside a token's text: the text before it, and the token's id kept.
  r = feed({0, 1, 2}, {}, {"lo,"});
  EXPECT_EQ(r.pieces, (Pieces{"Hel", "", ""}));
  EXPECT_EQ(r.completion.ids(), (std::vector<int32_t>{0, 1}));
  // Several stops: whichever comes first.
  r = feed({0, 4, 5}, {}, {"###", "\n"});
  EXPECT_EQ(r.completion.text(), "Hello");
  EXPECT_EQ(r.completion.ids(), (std::vector<int32_t>{0, 4}));
}

TEST(Completion, AStopInTheHeldCharacterFoundAtTheEndIsAStop) {
  // Token 9's held half becomes "?" at finish(): a stop string "?" ends it there, with finish reason stop.
  const Fed r = feed({0, 9}, {}, {"?"});
  EXPECT_EQ(r.pieces, (Pieces{"Hello", "", ""}));
  EXPECT_EQ(r.completion.finish_reason(), FinishReason::kStop);
  // Completed by token 10, the character is printed whole.
  EXPECT_EQ(feed({9, 10}, {}, {"?"}).completion.text(), "\xC3\xA9");
}

TEST(Completion, IdsOnlyHaveNoText) {
  Completion c(nullptr, {7}, {});
  EXPECT_FALSE(c.has_text());
  EXPECT_EQ(c.push(3), "");
  EXPECT_EQ(c.push(7), "");
  EXPECT_TRUE(c.finished());
  EXPECT_EQ(c.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(c.text(), "");
  Completion length(nullptr, {}, {});
  length.push(1);
  EXPECT_EQ(length.finish(), "");
  EXPECT_EQ(length.finish_reason(), FinishReason::kLength);
}

TEST(Completion, MisuseIsABug) {
  for (const auto& misuse :
       std::vector<std::function<void()>>{[] { Completion(nullptr, {}, {"stop"}); },  // stop strings without text
                                          [] {
                                            Completion c(std::make_unique<FakeStream>(), {7}, {});
                                            c.push(7);
                                            c.push(0);  // after the end
                                          }}) {
    try {
      misuse();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
    }
  }
}

}  // namespace
}  // namespace st

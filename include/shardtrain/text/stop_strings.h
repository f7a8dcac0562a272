// Generated text cut before the first occurrence of any of a set of stop strings (`generate --stop`), released piece
// by piece as it comes: a piece is returned as soon as no stop string can start in it, and the end of the text that
// could still be the start of one is held back until the next piece settles it.
//
//   StopStrings stop({"\n\n", "###"});
//   print(stop.push(piece));       // for every piece of text, in order
//   if (stop.stopped()) ...        // a stop string was found: the text released ends before it
//   print(stop.finish());          // the end of the text: what was held back
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace st {

class StopStrings {
 public:
  // `stops`: non-empty strings, matched byte for byte; none: push() releases each piece whole.
  explicit StopStrings(std::vector<std::string> stops);

  // Appends `piece` to the text and returns the part of it not released yet that no stop string can reach any more.
  // Once a stop string is found, returns the text up to its start, stopped() is true and further pieces are ignored
  // (returning "").
  std::string push(std::string_view piece);
  // The text held back (no stop string found: it ends the text), "" once stopped.
  std::string finish();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // released text never holds a stop string's start: it begins at or before held_
  bool stopped_ = false;
};

}  // namespace st

// The st::Error a piece of code throws, as a value, for tests that check its kind and message.
#pragma once

#include <gtest/gtest.h>

#include "shardtrain/core/error.h"

namespace st::testing {

// Runs `f`, expects st::Error, and returns it (kind and message); when nothing is thrown, a test failure and an
// empty kInternal error.
template <typename F>
Error caught(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected st::Error, nothing was thrown";
  return Error(ErrorKind::kInternal, "");
}

}  // namespace st::testing

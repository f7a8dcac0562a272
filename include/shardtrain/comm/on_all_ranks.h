// Failing together: a step that only some ranks may fail (a check one rank makes, a file one rank reads) must
// not leave the others waiting in their next collective for a rank that gave up.
//
//   on_all_ranks(comm, [&] { if (comm.rank() == 0) lock = DirLock::acquire(dir); }, "could not take ckpt.dir");
#pragma once

#include <functional>

#include "shardtrain/comm/communicator.h"

namespace st {

// Runs fn on every rank, then agrees (collectively, always: one all-reduce, plus two broadcasts on failure). If
// fn threw on any rank, every rank throws the error of the lowest such rank: its kind (kInternal for an exception
// that is not an st::Error) and its message. With `what`, the other ranks' copies read
// "<prefix> stopped: rank R <what>: <message>".
void on_all_ranks(Communicator& comm, const std::function<void()>& fn, const char* what = nullptr);

}  // namespace st

// A streamed read of a decoder's weights (decode_weights.h) on a thread of its own, running ahead of whoever takes the
// units, so that the weights are read while the decoder is made (on a GPU: the device opened, its memory planned, the
// buffers allocated) and while each unit read before is handed over.
//
//   UnitReadAhead ahead([&](const UnitSink& sink) { read_init_from_weights(cfg, sink); });
//   std::unique_ptr<Decoder> d = make_unloaded_decoder(cfg);
//   ahead.drain([&](int u, std::vector<float>& values) { d->load_unit(u, values); });
//
// The units reach drain's taker in the order the read gives them, each in its own buffer. One read unit waits for the
// taker at most, so the host holds at most three units' buffers: the one being read, the one waiting, the one being
// taken. A buffer the taker leaves (a GPU decoder copies a unit and leaves it) goes back to the read for a later unit,
// so that the read fills memory it has touched before; one the taker keeps (the CPU decoder's) does not.
//
// An exception of the read is rethrown by drain once the units read before it are taken. An exception of the taker,
// or a read-ahead destroyed before its drain, stops the read where it hands its next unit, and the destructor joins
// the thread: nothing runs on after the read-ahead is gone.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "shardtrain/ckpt/decode_weights.h"

namespace st {

class UnitReadAhead {
 public:
  using Read = std::function<void(const UnitSink& sink)>;
  // Starts `read` on a thread of its own, with a sink that queues each unit for drain.
  explicit UnitReadAhead(Read read);
  UnitReadAhead(const UnitReadAhead&) = delete;
  UnitReadAhead& operator=(const UnitReadAhead&) = delete;
  ~UnitReadAhead();

  // Hands every unit the read gives to `take`, in order, on the calling thread, until the read ends; rethrows the
  // read's exception, if it threw, after the units before it. Once only.
  void drain(const UnitSink& take);
  // Seconds drain waited for the read (no unit ready yet): what reading added to the load beyond the overlap.
  double waited_seconds() const { return waited_; }

 private:
  void run(const Read& read);

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::pair<int, std::vector<float>>> ready_;  // read, not yet taken (at most one)
  std::vector<float> spare_;                              // a buffer the taker left, for the read's next unit
  bool ended_ = false;                                    // the read returned or threw
  bool stopping_ = false;                                 // the destructor asks the read to stop
  std::exception_ptr error_;                              // what the read threw, but a stop
  double waited_ = 0;
  std::thread thread_;
};

}  // namespace st

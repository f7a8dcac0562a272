#include "shardtrain/comm/on_all_ranks.h"

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {

void on_all_ranks(Communicator& comm, const std::function<void()>& fn, const char* what) {
  const int world = comm.world_size();
  std::string message;
  std::vector<double> kinds(static_cast<size_t>(world), 0.0);  // 1 + ErrorKind of each failed rank, else 0
  double& mine = kinds[static_cast<size_t>(comm.rank())];
  try {
    fn();
  } catch (const Error& e) {
    message = e.what();
    mine = 1.0 + static_cast<int>(e.kind());
  } catch (const std::exception& e) {
    message = e.what();
    mine = 1.0 + static_cast<int>(ErrorKind::kInternal);
  }
  comm.all_reduce(kinds.data(), world);
  for (int r = 0; r < world; ++r) {
    if (kinds[static_cast<size_t>(r)] == 0.0) continue;
    int64_t bytes = static_cast<int64_t>(message.size());
    comm.broadcast(&bytes, sizeof(bytes), r);
    std::string text = comm.rank() == r ? message : std::string(static_cast<size_t>(bytes), '\0');
    if (bytes > 0) comm.broadcast(text.data(), bytes, r);
    const auto kind = static_cast<ErrorKind>(static_cast<int>(kinds[static_cast<size_t>(r)]) - 1);
    if (comm.rank() == r || what == nullptr) throw Error(kind, text);
    throw Error(kind, str_cat(process_prefix(), " stopped: rank ", r, " ", what, ": ", text));
  }
}

}  // namespace st

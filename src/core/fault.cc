#include "shardtrain/core/fault.h"

#include <string>

#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"

namespace st {

bool fault_injected(const char* point, int rank, int64_t step) {
  const std::string spec = env_get("SHARDTRAIN_FAULT");
  if (spec.empty()) return false;
  const auto colon = spec.find(':');
  if (colon == std::string::npos) ST_BAD_INPUT("SHARDTRAIN_FAULT='", spec, "': expected POINT:RANK[@STEP]");
  const auto at = spec.find('@', colon);
  const std::string who = spec.substr(colon + 1, at == std::string::npos ? std::string::npos : at - colon - 1);
  if (spec.substr(0, colon) != point || who != std::to_string(rank)) return false;
  return at == std::string::npos || spec.substr(at + 1) == std::to_string(step);
}

}  // namespace st

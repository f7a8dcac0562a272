#include "shardtrain/model/family.h"

#include "shardtrain/core/error.h"

namespace st {

const ModelFamily& model_family(ModelArch arch) {
  switch (arch) {
    case ModelArch::kGpt2:
      return gpt2_family();
    case ModelArch::kLlama:
      return llama_family();
  }
  ST_CHECK(false, "unknown model family ", static_cast<int>(arch));
}

}  // namespace st

#include "shardtrain/model/fp8_policy.h"

namespace st {

Fp8Policy fp8_policy(Fp8Recipe recipe) {
  Fp8Policy p;
  p.recipe = recipe;
  const bool rowwise = recipe == Fp8Recipe::kRowwise;
  p.power_of_2 = rowwise;
  const auto op = [&](Fp8Format f, Fp8Scaling s) { return Fp8Operand{f, rowwise ? s : Fp8Scaling::kTensor}; };
  p.forward = {op(Fp8Format::kE4M3, Fp8Scaling::kRow), op(Fp8Format::kE4M3, Fp8Scaling::kRow)};
  p.input_grad = {op(Fp8Format::kE5M2, Fp8Scaling::kRow), op(Fp8Format::kE4M3, Fp8Scaling::kColumn)};
  p.weight_grad = {op(Fp8Format::kE5M2, Fp8Scaling::kColumn), op(Fp8Format::kE4M3, Fp8Scaling::kColumn)};
  return p;
}

}  // namespace st

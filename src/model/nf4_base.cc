#include "shardtrain/model/nf4_base.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "shardtrain/core/error.h"

namespace st {

namespace {

constexpr int64_t kPartAlignment = 16;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// The tensor's first element in the frozen segment.
int64_t segment_offset(const UnitLayout& unit, const TensorSpec& t) { return t.offset - unit.numel; }

uint32_t bits_of(float f) {
  uint32_t b = 0;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Which frozen tensors are quantised: the matrices (two dimensions) of an nf4_base unit.
bool nf4_quantizes(const UnitLayout& unit, const TensorSpec& t) {
  return unit.nf4_base && t.frozen && t.shape.size() == 2;
}

}  // namespace

Nf4UnitStorage nf4_unit_storage(const UnitLayout& unit) {
  ST_CHECK(unit.nf4_base, unit.name, " does not store its frozen tensors as NF4");
  Nf4UnitStorage s;
  int64_t at = 0;
  for (size_t i = 0; i < unit.tensors.size(); ++i) {
    const TensorSpec& t = unit.tensors[i];
    if (!t.frozen) continue;
    const bool quantized = nf4_quantizes(unit, t);
    const int64_t row_len = t.numel / std::max<int64_t>(t.shape[0], 1);
    std::vector<int64_t> rows = t.nf4_rows;
    if (!quantized || rows.empty()) rows = {t.shape.empty() ? 1 : t.shape[0]};
    int64_t first = 0;
    for (int64_t r : rows) {
      Nf4Part p;
      p.tensor = static_cast<int>(i);
      p.first = first;
      p.numel = quantized ? r * row_len : t.numel;
      p.byte_offset = at;
      p.quantized = quantized;
      p.bytes = quantized ? nf4_bytes(p.numel) : p.numel * static_cast<int64_t>(sizeof(float));
      at = round_up(at + p.bytes, kPartAlignment);
      first += p.numel;
      s.parts.push_back(p);
    }
    ST_CHECK(first == t.numel, unit.name, ".", t.name, ": its NF4 parts cover ", first, " of ", t.numel, " elements");
  }
  s.words = at / static_cast<int64_t>(sizeof(float));
  return s;
}

void nf4_quantize_unit(const UnitLayout& unit, const Nf4UnitStorage& s, const float* segment, uint8_t* storage) {
  std::memset(storage, 0, static_cast<size_t>(s.words) * sizeof(float));  // the alignment gaps too
  for (const Nf4Part& p : s.parts) {
    const TensorSpec& t = unit.tensors[static_cast<size_t>(p.tensor)];
    const float* x = segment + segment_offset(unit, t) + p.first;
    if (p.quantized)
      nf4_quantize(x, p.numel, nf4_view(storage + p.byte_offset, p.numel), nf4_part_name(unit, p));
    else
      std::memcpy(storage + p.byte_offset, x, static_cast<size_t>(p.bytes));
  }
}

void nf4_dequantize_unit(const UnitLayout& unit, const Nf4UnitStorage& s, const uint8_t* storage, float* segment) {
  for (const Nf4Part& p : s.parts) {
    const TensorSpec& t = unit.tensors[static_cast<size_t>(p.tensor)];
    float* out = segment + segment_offset(unit, t) + p.first;
    if (p.quantized)
      nf4_dequantize(nf4_view(storage + p.byte_offset, p.numel), out);
    else
      std::memcpy(out, storage + p.byte_offset, static_cast<size_t>(p.bytes));
  }
}

std::string nf4_part_name(const UnitLayout& unit, const Nf4Part& p) {
  const TensorSpec& t = unit.tensors[static_cast<size_t>(p.tensor)];
  if (p.numel == t.numel) return unit.name + "." + t.name;
  const int64_t row_len = t.numel / t.shape[0];
  return str_cat(unit.name, ".", t.name, " rows [", p.first / row_len, ", ", (p.first + p.numel) / row_len, ")");
}

float unwritten_frozen() { return std::numeric_limits<float>::quiet_NaN(); }

bool nf4_view_written(const UnitLayout& unit, const float* segment) {
  const uint32_t unwritten = bits_of(unwritten_frozen());
  int written = 0, frozen = 0;
  for (const TensorSpec& t : unit.tensors) {
    if (!t.frozen || t.numel == 0) continue;
    ++frozen;
    written += bits_of(segment[segment_offset(unit, t)]) != unwritten ? 1 : 0;
  }
  ST_CHECK(written == 0 || written == frozen, unit.name, ": ", written, " of its ", frozen,
           " frozen tensors were written into its NF4 view; a unit's NF4 base is quantised whole");
  return written > 0;
}

}  // namespace st

// nf4_codes IN OUT: quantises IN (raw little-endian float32 weights) with nf4_quantize and writes OUT, for
// tests/kernels/nf4_test.py to compare with its own NumPy quantiser:
//   int64 n, int64 blocks, int64 groups, float32 offset, then codes (ceil(n/2) bytes), absmax codes (blocks int8),
//   scales (groups float32) and the dequantised weights (n float32).
// A weight the quantiser refuses: its message on stderr, exit 2.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/nf4.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: nf4_codes IN OUT\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<float> w(bytes.size() / sizeof(float));
  std::copy(bytes.begin(), bytes.begin() + static_cast<long>(w.size() * sizeof(float)),
            reinterpret_cast<char*>(w.data()));
  try {
    const st::Nf4Quantized q = st::nf4_quantize(w.data(), static_cast<int64_t>(w.size()), "weights");
    std::vector<float> back(w.size());
    st::nf4_dequantize(q.view(), back.data());
    std::ofstream out(argv[2], std::ios::binary);
    const int64_t head[3] = {q.n, static_cast<int64_t>(q.absmax_codes.size()),
                             static_cast<int64_t>(q.absmax_scales.size())};
    out.write(reinterpret_cast<const char*>(head), sizeof(head));
    out.write(reinterpret_cast<const char*>(&q.absmax_offset), sizeof(float));
    out.write(reinterpret_cast<const char*>(q.codes.data()), static_cast<std::streamsize>(q.codes.size()));
    out.write(reinterpret_cast<const char*>(q.absmax_codes.data()),
              static_cast<std::streamsize>(q.absmax_codes.size()));
    out.write(reinterpret_cast<const char*>(q.absmax_scales.data()),
              static_cast<std::streamsize>(q.absmax_scales.size() * sizeof(float)));
    out.write(reinterpret_cast<const char*>(back.data()), static_cast<std::streamsize>(back.size() * sizeof(float)));
    return out ? 0 : 1;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

// Summary statistics of repeated measurements (step rates, kernel timings).
#pragma once

#include <vector>

namespace st {

// The median of v: the middle value, the upper of the two middle ones for an even count; 0 for an empty v.
double median(std::vector<double> v);

}  // namespace st

#include "shardtrain/train/metrics_file.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "shardtrain/core/error.h"

namespace st {

MetricsSeries read_metrics_series(const std::string& path, const std::vector<std::string>& keys) {
  std::ifstream in(path);
  if (!in) ST_BAD_INPUT("plot: cannot open metrics file ", path);
  // step -> the values of its last record, per key (std::map keeps the steps sorted).
  std::map<std::string, std::map<int64_t, double>> by_key;
  std::set<int64_t> steps, replaced;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      // The parser numbers lines within the one line it was given: keep its "column N: why" only.
      const std::string what = e.what();
      const size_t column = what.find("column ");
      ST_BAD_INPUT(path, ":", number, ": not a JSON object (", column == std::string::npos ? what : what.substr(column),
                   ")");
    }
    if (!record.is_object()) ST_BAD_INPUT(path, ":", number, ": expected a JSON object, got ", record.type_name());
    const auto step_it = record.find("step");
    if (step_it == record.end()) continue;
    if (!step_it->is_number_integer() || step_it->get<int64_t>() < 0)
      ST_BAD_INPUT(path, ":", number, ": \"step\" must be a non-negative integer, got ", step_it->dump());
    const int64_t step = step_it->get<int64_t>();
    steps.insert(step);
    for (const std::string& key : keys) {
      const auto it = record.find(key);
      if (it == record.end() || it->is_null()) continue;
      if (!it->is_number())
        ST_BAD_INPUT(path, ":", number, ": \"", key, "\" must be a number or null, got ", it->dump());
      const bool fresh = by_key[key].insert_or_assign(step, it->get<double>()).second;  // the last record wins
      if (!fresh) replaced.insert(step);
    }
  }
  if (steps.empty())
    ST_BAD_INPUT("plot: ", path, " has no records with a \"step\" (empty, or not a shardtrain metrics file)");
  MetricsSeries out;
  out.steps = static_cast<int64_t>(steps.size());
  out.first_step = *steps.begin();
  out.last_step = *steps.rbegin();
  out.replaced_steps = static_cast<int64_t>(replaced.size());
  for (const std::string& key : keys) {
    std::vector<SeriesPoint>& points = out.series[key];
    for (const auto& [step, value] : by_key[key]) points.push_back({step, value});
  }
  return out;
}

}  // namespace st

#include "shardtrain/ckpt/hf_dir.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"

namespace fs = std::filesystem;

namespace st {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

}  // namespace

HfDirWeights::HfDirWeights(const std::string& dir) : dir_(dir) {
  const fs::path index = fs::path(dir) / kIndexFile;
  if (fs::is_regular_file(index)) {
    index_path_ = index.string();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(index_path_));
    } catch (const nlohmann::json::exception& e) {
      ST_BAD_INPUT(index_path_, ": not valid JSON: ", excerpt(e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
      ST_BAD_INPUT(index_path_, ": expected an object with a weight_map object (tensor name -> file name)");
    for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
      // A file name, never a path: the index may not point outside the directory.
      if (!it.value().is_string() || it.value().get<std::string>().empty() ||
          it.value().get<std::string>().find('/') != std::string::npos || it.value().get<std::string>() == "..")
        ST_BAD_INPUT(index_path_, ": weight_map[", excerpt(it.key()), "] is ", excerpt(it.value().dump()),
                     ", expected the name of a file in ", dir);
      weight_map_.emplace(it.key(), it.value().get<std::string>());
    }
    // Every file the index names is opened (its header validated) and must hold exactly the tensors the index
    // places in it: a tensor in a file that the index does not list there would be loaded by nobody, or from
    // another file than the one holding it.
    std::map<std::string, std::set<std::string>> listed;  // file -> the tensors the index places in it
    for (const auto& [name, file] : weight_map_) listed[file].insert(name);
    for (const auto& [file, names] : listed) {
      const SafetensorsReader& r = reader(file);
      for (const std::string& name : names)
        if (!r.has(name))
          ST_BAD_INPUT(r.path(), ": tensor ", excerpt(name), " is missing (", index_path_, " places it in this file)");
      for (const std::string& name : r.names()) {
        if (names.count(name) != 0) continue;
        const auto elsewhere = weight_map_.find(name);
        ST_BAD_INPUT(r.path(), ": holds tensor ", excerpt(name), ", which ", index_path_,
                     elsewhere == weight_map_.end() ? std::string(" does not list (its weight_map has no such tensor)")
                                                    : " places in " + elsewhere->second);
      }
    }
    return;
  }
  if (!fs::is_regular_file(fs::path(dir) / kSingleFile))
    ST_BAD_INPUT("Hugging Face model directory ", dir, " holds neither ", kSingleFile, " nor ", kIndexFile);
  for (const std::string& name : reader(kSingleFile).names()) weight_map_.emplace(name, kSingleFile);
}

const SafetensorsReader& HfDirWeights::reader(const std::string& file) const {
  auto it = readers_.find(file);
  if (it == readers_.end())
    it = readers_.emplace(file, std::make_unique<SafetensorsReader>((fs::path(dir_) / file).string())).first;
  return *it->second;
}

bool HfDirWeights::has(const std::string& name) const { return weight_map_.count(name) != 0; }

std::vector<std::string> HfDirWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : weight_map_) out.push_back(name);
  return out;
}

std::string HfDirWeights::path_of(const std::string& name) const { return reader(file_of(name)).path(); }

const std::vector<int64_t>& HfDirWeights::shape(const std::string& name) const {
  return reader(file_of(name)).shape(name);
}

const std::string& HfDirWeights::dtype(const std::string& name) const { return reader(file_of(name)).dtype(name); }

const std::string& HfDirWeights::file_of(const std::string& name) const {
  const auto it = weight_map_.find(name);
  if (it == weight_map_.end())
    ST_BAD_INPUT(dir_, ": tensor ", name, " is missing (",
                 index_path_.empty() ? str_cat("not in ", (fs::path(dir_) / kSingleFile).string())
                                     : str_cat("not in the weight_map of ", index_path_),
                 ")");
  return it->second;
}

void HfDirWeights::check(const std::string& name, const std::vector<int64_t>& shape) const {
  const std::string& file = file_of(name);
  const SafetensorsReader& r = reader(file);
  if (!r.has(name)) ST_BAD_INPUT(r.path(), ": tensor ", name, " is missing (", index_path_, " places it in this file)");
  if (r.shape(name) != shape)
    ST_BAD_INPUT(r.path(), ": tensor ", name, " has shape ", shape_text(r.shape(name)), ", expected ",
                 shape_text(shape));
  const std::string& dtype = r.dtype(name);
  if (dtype != "F32" && dtype != "F16" && dtype != "BF16")
    ST_BAD_INPUT(r.path(), ": tensor ", name, " has dtype ", dtype, "; F32, F16 and BF16 are supported");
}

void HfDirWeights::read_range(const std::string& name, int64_t begin, int64_t count, float* out) const {
  reader(file_of(name)).read_range(name, begin, count, out);
}

int64_t HfDirWeights::read_range_half(const std::string& name, int64_t begin, int64_t count, HalfKind kind,
                                      uint16_t* out) const {
  return reader(file_of(name)).read_range_half(name, begin, count, kind, out);
}

}  // namespace st

// `shardtrain ckpt ...`: argument parsing and printing around the checkpoint tools of ckpt/tools.h.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/core/error.h"

namespace {

constexpr const char* kCkptUsage =
    "usage: shardtrain ckpt <tool> STEP_DIR [options]\n"
    "\n"
    "STEP_DIR is a committed checkpoint directory, e.g. ckpt/step_00000100 (it holds manifest.json).\n"
    "\n"
    "tools:\n"
    "  inspect STEP_DIR                 step, world size, training state, model config, units with their\n"
    "                                   tensors, and the rank files with their sizes and SHA-256\n"
    "  verify STEP_DIR                  checks the manifest and every rank file (size, SHA-256, structure,\n"
    "                                   spans); exit 0 if all is well, 2 naming the first bad file\n"
    "  export STEP_DIR --out PATH       consolidated fp32 weights with Hugging Face GPT-2 names and layouts;\n"
    "                                   PATH ends in .safetensors or .h5; config.json is written beside it\n";

// The one positional STEP_DIR, refusing anything else unknown.
std::string step_dir_arg(const std::string& tool, const std::vector<std::string>& positional) {
  if (positional.size() != 1)
    ST_BAD_INPUT("ckpt ", tool, ": expected one STEP_DIR, got ", positional.size(), " arguments (see shardtrain ckpt --help)");
  return positional[0];
}

}  // namespace

int cmd_ckpt(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kCkptUsage, stderr);
    return st::kExitBadInput;
  }
  const std::string& tool = args[0];
  if (tool == "--help" || tool == "-h" || tool == "help") {
    std::fputs(kCkptUsage, stdout);
    return st::kExitOk;
  }
  std::vector<std::string> positional;
  std::string out;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kCkptUsage, stdout);
      return st::kExitOk;
    }
    if (tool == "export" && a == "--out") {
      if (i + 1 >= args.size()) ST_BAD_INPUT("ckpt export: --out needs a path ending in .safetensors or .h5");
      out = args[++i];
    } else if (tool == "export" && a.rfind("--out=", 0) == 0) {
      out = a.substr(std::strlen("--out="));
    } else if (a.rfind("--", 0) == 0) {
      ST_BAD_INPUT("ckpt ", tool, ": unknown option ", a, " (see shardtrain ckpt --help)");
    } else {
      positional.push_back(a);
    }
  }

  if (tool == "inspect") {
    std::fputs(st::inspect_checkpoint(step_dir_arg(tool, positional)).c_str(), stdout);
    return st::kExitOk;
  }
  if (tool == "verify") {
    const std::string dir = step_dir_arg(tool, positional);
    const st::VerifyReport r = st::verify_checkpoint(dir);
    std::printf("OK: %s: %d files, %lld bytes verified\n", dir.c_str(), r.files, static_cast<long long>(r.bytes));
    return st::kExitOk;
  }
  if (tool == "export") {
    const std::string dir = step_dir_arg(tool, positional);
    if (out.empty()) ST_BAD_INPUT("ckpt export: --out PATH is required (PATH ends in .safetensors or .h5)");
    if (!st::export_format_for(out))
      ST_BAD_INPUT("ckpt export: --out ", out, ": unsupported suffix; allowed: .safetensors, .h5");
    const st::ExportReport r = st::export_checkpoint(dir, out);
    std::printf("exported %s: %d tensors, %lld bytes to %s; config: %s\n", dir.c_str(), r.tensors,
                static_cast<long long>(r.bytes), r.path.c_str(), r.config_path.c_str());
    return st::kExitOk;
  }
  ST_BAD_INPUT("ckpt: unknown tool '", tool, "' (expected: inspect, verify, export; see shardtrain ckpt --help)");
}

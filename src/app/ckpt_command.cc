// `shardtrain ckpt ...`: argument parsing and printing around the checkpoint tools of ckpt/tools.h.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/peft_adapter.h"
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
    "                                   spans); exit 0 if all is well, 2 naming the first bad file. A node-local\n"
    "                                   copy (ckpt.replicas=1) checks the files it holds, and lists them as its\n"
    "                                   node's primaries and the next node's replicas\n"
    "  export STEP_DIR --out PATH       gpt2: consolidated fp32 weights with Hugging Face GPT-2 names and layouts;\n"
    "                                   PATH ends in .safetensors or .h5; config.json is written beside it.\n"
    "                                   Both must be new: an existing PATH or config.json is refused (exit 2)\n"
    "  export STEP_DIR --out DIR [--dtype f32|bf16] [--max-shard-size SIZE]\n"
    "                                   llama: a Hugging Face model directory (config.json, model.safetensors or\n"
    "                                   shards with model.safetensors.index.json) that LlamaForCausalLM or\n"
    "                                   Qwen2ForCausalLM loads; DIR must be new or empty. --dtype: f32 (default)\n"
    "                                   or bf16. --max-shard-size: bytes per file before splitting, with an\n"
    "                                   optional KB, MB or GB (powers of 1000, as Hugging Face's; default 5GB).\n"
    "                                   A LoRA checkpoint exports its base (init.from, checked against the digests\n"
    "                                   it recorded) with the adapters merged in\n"
    "  export STEP_DIR --merged PATH    the same for a LoRA checkpoint only (gpt2: a file, llama: a directory)\n"
    "  export STEP_DIR --adapter DIR    a LoRA checkpoint's adapters in PEFT's layout (adapter_config.json,\n"
    "                                   adapter_model.safetensors), which peft.PeftModel.from_pretrained loads\n"
    "                                   onto the base model; DIR must be new or empty\n";

// "5GB", "200MB", "1000": bytes, in powers of 1000 as Hugging Face's max_shard_size.
int64_t parse_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string unit = text.substr(digits);
  int64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KB") scale = 1000;
  if (unit == "MB") scale = 1000 * 1000;
  if (unit == "GB") scale = 1000 * 1000 * 1000;
  if (digits == 0 || digits > 12 || scale == 0)
    ST_BAD_INPUT("ckpt export: --max-shard-size '", text,
                 "': expected a byte count with an optional KB, MB or GB, "
                 "e.g. 5GB");
  const int64_t n = std::stoll(text.substr(0, digits)) * scale;
  if (n <= 0) ST_BAD_INPUT("ckpt export: --max-shard-size must be > 0 (got ", text, ")");
  return n;
}

st::SafetensorsDtype parse_dtype(const std::string& text) {
  if (text == "f32") return st::SafetensorsDtype::kF32;
  if (text == "bf16") return st::SafetensorsDtype::kBF16;
  ST_BAD_INPUT("ckpt export: --dtype '", text, "': expected f32 or bf16");
}

// The one positional STEP_DIR, refusing anything else unknown.
std::string step_dir_arg(const std::string& tool, const std::vector<std::string>& positional) {
  if (positional.size() != 1)
    ST_BAD_INPUT("ckpt ", tool, ": expected one STEP_DIR, got ", positional.size(),
                 " arguments (see shardtrain ckpt --help)");
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
  std::string out, dtype, max_shard_size, adapter, merged;
  // An export option as "--name VALUE" or "--name=VALUE"; true if `a` is one (and stores its value).
  size_t i = 1;
  auto option = [&](const std::string& a, const char* name, std::string& value) {
    const std::string eq = std::string(name) + "=";
    if (a.rfind(eq, 0) == 0) {
      value = a.substr(eq.size());
      return true;
    }
    if (a != name) return false;
    if (i + 1 >= args.size()) ST_BAD_INPUT("ckpt export: ", name, " needs a value (see shardtrain ckpt --help)");
    value = args[++i];
    return true;
  };
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kCkptUsage, stdout);
      return st::kExitOk;
    }
    if (tool == "export" &&
        (option(a, "--out", out) || option(a, "--dtype", dtype) || option(a, "--max-shard-size", max_shard_size) ||
         option(a, "--adapter", adapter) || option(a, "--merged", merged))) {
      continue;
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
    if (r.node_local) {
      auto names = [](const std::vector<std::string>& v) {
        std::string out;
        for (const std::string& n : v) out += (out.empty() ? "" : ", ") + n;
        return out.empty() ? std::string("none") : out;
      };
      std::printf("node-local copy of node %d of %d (ckpt.replicas=1): primaries %s; replicas %s", r.node, r.nodes,
                  names(r.primaries).c_str(), names(r.replicas).c_str());
      if (!r.elsewhere.empty())
        std::printf("; on other nodes' disks, not checked here: %s", names(r.elsewhere).c_str());
      std::printf("\n");
    }
    return st::kExitOk;
  }
  if (tool == "export") {
    const std::string dir = step_dir_arg(tool, positional);
    if ((!adapter.empty()) + (!merged.empty()) + (!out.empty()) > 1)
      ST_BAD_INPUT("ckpt export: one of --out, --merged and --adapter at a time");
    if (!adapter.empty()) {
      if (!dtype.empty() || !max_shard_size.empty())
        ST_BAD_INPUT("ckpt export: --dtype and --max-shard-size apply to a model directory; --adapter writes F32");
      const st::AdapterExportReport r = st::export_peft_adapter(dir, adapter);
      std::printf("exported %s: %d adapter tensors, %lld bytes, to %s\n", dir.c_str(), r.tensors,
                  static_cast<long long>(r.bytes), r.dir.c_str());
      return st::kExitOk;
    }
    if (!merged.empty()) {
      if (!st::open_checkpoint(dir).model.lora.enabled())
        ST_BAD_INPUT("ckpt export ", dir, " --merged: this checkpoint trained the whole model (no LoRA adapters to ",
                     "merge): export it with --out");
      out = merged;
    }
    if (out.empty())
      ST_BAD_INPUT("ckpt export: --out is required (gpt2: a file ending in .safetensors or .h5; llama: a directory)");
    if (!st::export_format_for(out)) {
      // No file suffix: a Hugging Face model directory (llama checkpoints).
      st::HfDirExportOptions options;
      if (!dtype.empty()) options.dtype = parse_dtype(dtype);
      if (!max_shard_size.empty()) options.max_shard_bytes = parse_size(max_shard_size);
      const st::HfDirExportReport r = st::export_checkpoint_hf_dir(dir, out, options);
      std::printf("exported %s: %d tensors in %d file(s), %lld bytes, to %s\n", dir.c_str(), r.tensors, r.files,
                  static_cast<long long>(r.bytes), r.dir.c_str());
      return st::kExitOk;
    }
    if (!dtype.empty() || !max_shard_size.empty())
      ST_BAD_INPUT("ckpt export: --dtype and --max-shard-size apply to a llama checkpoint's directory export; ", out,
                   " names a GPT-2 weights file, which is fp32");
    const st::ExportReport r = st::export_checkpoint(dir, out);
    std::printf("exported %s: %d tensors, %lld bytes to %s; config: %s\n", dir.c_str(), r.tensors,
                static_cast<long long>(r.bytes), r.path.c_str(), r.config_path.c_str());
    return st::kExitOk;
  }
  ST_BAD_INPUT("ckpt: unknown tool '", tool, "' (expected: inspect, verify, export; see shardtrain ckpt --help)");
}

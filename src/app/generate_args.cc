#include "generate_args.h"

#include <cmath>
#include <exception>
#include <type_traits>

#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"

const char* const kGenerateUsage =
    "usage: shardtrain generate (--ckpt DIR | --init.from PATH) (--prompt TEXT | --prompt-ids 1,2,3 | --prompts FILE)\n"
    "                           [--chat] [--stop STR ...] [--jsonl] [--tokenizer FILE] [--max-tokens N] [--batch N]\n"
    "                           [--temperature T] [--top-k K] [--seed S] [--split auto|layers|none]\n"
    "                           [--train.device=cpu|cuda]\n"
    "                           [--section.key=value ...]\n"
    "  continues each prompt with a model's weights, decoding with a key/value cache; it reads the weights alone:\n"
    "  --ckpt DIR          a committed checkpoint (step directory): its parameters, whatever world size wrote it;\n"
    "                      a LoRA checkpoint's base is read again from its init.from (--init.from=PATH names it\n"
    "                      where it has moved) or drawn from its train.seed, and the adapters are merged in\n"
    "  --init.from PATH    a Hugging Face model directory (its config.json gives the model) or a GPT-2\n"
    "                      .safetensors/.h5 file, as train --init.from reads it; the rest of the config is the\n"
    "                      built-in defaults (model.seq_len 128, the longest context: set it with --model.seq_len=N)\n"
    "  --prompt TEXT       text, read through the tokenizer as a new document (its family's separator first), or one\n"
    "                      token a byte for byte-level models (model.vocab_size 256)\n"
    "  --prompt-ids LIST   token ids, comma-separated (any model)\n"
    "  --prompts FILE      a prompt a line, every line checked before decoding (blank lines are skipped); a FILE\n"
    "                      named *.jsonl or *.json holds a JSON object a line with one of \"prompt\" (text),\n"
    "                      \"prompt_ids\" (ids) or \"messages\" (a chat, [{\"role\": R, \"content\": C}, ...], "
    "rendered\n"
    "                      as --chat renders a prompt); any other FILE is text. Prints a result a line, in the\n"
    "                      file's order, each once it and those before it are done, with \\, newline and carriage\n"
    "                      return written as \\\\, \\n and \\r\n"
    "  --chat              the prompt's text as a user message in the tokenizer's chat template (Llama 3 Instruct,\n"
    "                      Qwen 2.5 Instruct, Qwen3), then the assistant's header: apply_chat_template(...,\n"
    "                      add_generation_prompt=True); a chat ends at its end-of-turn or end-of-text token\n"
    "                      (<|eot_id|>, <|end_of_text|>; <|im_end|>, <|endoftext|>), which is not printed\n"
    "  --stop STR          (repeatable) a sequence ends where its text holds STR; its text ends before STR\n"
    "  --jsonl             a JSON line a result: {\"index\": I, \"text\": T, \"token_ids\": [...], \"finish_reason\":\n"
    "                      \"length\" or \"stop\", \"prompt_token_ids\": [...]} (\"text\" null when it prints ids)\n"
    "  --tokenizer FILE    a Hugging Face tokenizer.json (default: the checkpoint's data.tokenizer, or the\n"
    "                      tokenizer.json of the --init.from directory), read when a prompt is text or --stop is\n"
    "                      given; without either, the output is ids, comma-separated\n"
    "  --max-tokens N      tokens to generate for each prompt (default 100); past model.seq_len positions the context\n"
    "                      slides to the last model.seq_len / 2 tokens\n"
    "  --batch N           prompts of --prompts decoded together, one token each a step; each holds a key/value\n"
    "                      cache of model.seq_len positions (default: up to 16, as many as the GPU's free memory\n"
    "                      holds; a --batch that does not fit is refused with the memory's breakdown)\n"
    "  --temperature T     softmax temperature, >= 0 (default 1; 0: greedy, the most likely token)\n"
    "  --top-k K           sample among the K most likely tokens (default 0: all)\n"
    "  --seed S            the sampling seed (default 0): the same seed gives the same tokens on every run and rank,\n"
    "                      for each prompt whatever the others are\n"
    "  --split MODE        under mpirun, how the model goes on the ranks: layers splits it, each rank holding a\n"
    "                      contiguous stage of its blocks (weights and key/value caches) and every forward passing\n"
    "                      through the ranks in turn; none gives every rank the whole model; auto (default) splits\n"
    "                      on cuda when the whole model does not fit one GPU and its stages do (never on cpu)\n"
    "  --prompt and --prompt-ids print the text or ids to stdout as they are decoded; --prompts and --jsonl print\n"
    "  whole results; a summary with the load time and prefill and decode tokens/s goes to stderr. A closed stdout\n"
    "  ends it (exit 0), SIGINT or SIGTERM too, keeping what was printed (exit 130, 143)";

namespace {

// The value of `flag` in args[*i] ("--flag VALUE" or "--flag=VALUE"), advancing *i past it; nullopt when args[*i] is
// another argument.
std::optional<std::string> flag_value(const std::vector<std::string>& args, size_t* i, const std::string& flag) {
  const std::string& a = args[*i];
  if (a == flag) {
    if (*i + 1 >= args.size()) ST_BAD_INPUT(flag, " needs a value (see shardtrain generate --help)");
    return args[++*i];
  }
  if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  return std::nullopt;
}

// The whole of `text` as an integer (V = int64_t) or a number (V = double); kBadInput naming the flag and `expected`
// otherwise.
template <typename V>
V parse_value(const std::string& flag, const std::string& text, const std::string& expected) {
  size_t used = 0;
  V v = 0;
  try {
    if constexpr (std::is_same_v<V, double>)
      v = std::stod(text, &used);
    else
      v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    ST_BAD_INPUT(flag, " '", st::excerpt(text), "' is not ", std::is_same_v<V, double> ? "a number" : "an integer",
                 " (expected ", expected, ")");
  return v;
}

}  // namespace

int64_t parse_integer(const std::string& flag, const std::string& text, const std::string& expected) {
  return parse_value<int64_t>(flag, text, expected);
}

GenerateArgs parse_generate_args(const std::vector<std::string>& args) {
  GenerateArgs g;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      g.help = true;
    } else if (a == "--chat") {
      g.chat = true;
    } else if (a == "--jsonl") {
      g.jsonl = true;
    } else if (auto v = flag_value(args, &i, "--ckpt")) {
      g.dir = *v;
    } else if (auto v = flag_value(args, &i, "--init.from")) {
      g.init_from = *v;
      if (g.init_from.empty())
        ST_BAD_INPUT("--init.from is empty: name a Hugging Face model directory or a GPT-2 file");
    } else if (auto v = flag_value(args, &i, "--prompt")) {
      g.prompt = *v;
    } else if (auto v = flag_value(args, &i, "--prompt-ids")) {
      g.prompt_ids = *v;
    } else if (auto v = flag_value(args, &i, "--prompts")) {
      g.prompts_file = *v;
      if (v->empty()) ST_BAD_INPUT("--prompts is empty: name a file of prompts, one a line");
    } else if (auto v = flag_value(args, &i, "--stop")) {
      if (v->empty()) ST_BAD_INPUT("--stop is empty: expected the text that ends a sequence");
      g.stops.push_back(*v);
    } else if (auto v = flag_value(args, &i, "--tokenizer")) {
      g.overrides.push_back("--data.tokenizer=" + *v);
    } else if (auto v = flag_value(args, &i, "--batch")) {
      g.batch = parse_value<int64_t>("--batch", *v, "an integer >= 1");
      if (g.batch < 1 || g.batch > 4096) ST_BAD_INPUT("--batch ", g.batch, " is out of range (expected 1 to 4096)");
    } else if (auto v = flag_value(args, &i, "--max-tokens")) {
      g.max_tokens = parse_value<int64_t>("--max-tokens", *v, "an integer >= 1");
      if (g.max_tokens < 1) ST_BAD_INPUT("--max-tokens ", g.max_tokens, " is out of range (expected >= 1)");
    } else if (auto v = flag_value(args, &i, "--temperature")) {
      g.sampling.temperature = parse_value<double>("--temperature", *v, "a number >= 0; 0: greedy");
      if (!(g.sampling.temperature >= 0.0) || !std::isfinite(g.sampling.temperature))
        ST_BAD_INPUT("--temperature ", st::excerpt(*v), " is out of range (expected a finite number >= 0; 0: greedy)");
    } else if (auto v = flag_value(args, &i, "--top-k")) {
      g.sampling.top_k = parse_value<int64_t>("--top-k", *v, "an integer >= 0; 0: every token");
      if (g.sampling.top_k < 0)
        ST_BAD_INPUT("--top-k ", g.sampling.top_k, " is out of range (expected >= 0; 0: every token)");
    } else if (auto v = flag_value(args, &i, "--split")) {
      if (*v == "auto")
        g.split = st::LayerSplit::kAuto;
      else if (*v == "layers")
        g.split = st::LayerSplit::kLayers;
      else if (*v == "none")
        g.split = st::LayerSplit::kNone;
      else
        ST_BAD_INPUT("--split '", st::excerpt(*v), "' is not a split (expected auto, layers or none)");
    } else if (auto v = flag_value(args, &i, "--seed")) {
      const int64_t seed = parse_value<int64_t>("--seed", *v, "an integer >= 0");
      if (seed < 0) ST_BAD_INPUT("--seed ", seed, " is out of range (expected >= 0)");
      g.sampling.seed = static_cast<uint64_t>(seed);
    } else if (a.rfind("--", 0) == 0 && a.find('.') != std::string::npos) {
      g.overrides.push_back(a);  // --section.key=value: the config parser checks it
    } else {
      ST_BAD_INPUT("unknown argument '", st::excerpt(a), "' for shardtrain generate (see shardtrain generate --help)");
    }
  }
  if (g.help) return g;
  if (g.dir.empty() && g.init_from.empty())
    ST_BAD_INPUT(
        "shardtrain generate needs weights: --ckpt DIR (a committed step directory) or --init.from PATH (a "
        "Hugging Face model directory or a GPT-2 file)");
  std::vector<std::string> given;
  if (g.prompt) given.push_back("--prompt");
  if (g.prompt_ids) given.push_back("--prompt-ids");
  if (g.prompts_file) given.push_back("--prompts");
  if (given.empty())
    ST_BAD_INPUT("shardtrain generate needs a prompt: --prompt TEXT, --prompt-ids 1,2,3 or --prompts FILE");
  if (given.size() > 1)
    ST_BAD_INPUT("shardtrain generate takes one of --prompt TEXT, --prompt-ids 1,2,3 and --prompts FILE, not ",
                 given.size() == 2 ? "both " + given[0] + " and " + given[1] : "all three");
  if (g.chat && g.prompt_ids)
    ST_BAD_INPUT(
        "--chat renders text as a chat, and --prompt-ids gives token ids, read as they are: give the text "
        "with --prompt, or the ids without --chat");
  return g;
}

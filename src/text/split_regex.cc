// PCRE2 is compiled with UTF (the pattern and subject are UTF-8), UCP (\p, \d and case folding by Unicode
// properties), MULTILINE (^ and $ at line ends, as Oniguruma's Ruby syntax has them) and LF as the only newline.
// Matching uses the JIT when the platform has it, with one match block and one JIT stack per thread, so that a
// const SplitRegex serves any number of threads without locks or per-call allocation.
#include "split_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"

namespace st::text {
namespace {

// Unicode White_Space, which is Oniguruma's \s: TAB..CR, SPACE, NEL, NBSP, OGHAM SPACE MARK, EN QUAD..HAIR SPACE,
// LINE and PARAGRAPH SEPARATOR, NARROW NBSP, MEDIUM MATHEMATICAL SPACE, IDEOGRAPHIC SPACE.
constexpr char kWhiteSpace[] =
    R"(\t-\r\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

// The JIT's stack grows to this on demand: enough for the split patterns over runs of a million characters.
constexpr size_t kJitStackStart = 32 << 10;
constexpr size_t kJitStackMax = 8 << 20;

struct ThreadMatch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;

  ThreadMatch() {
    data = pcre2_match_data_create(1, nullptr);  // the whole match's offsets are all a split needs
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
    ST_CHECK(data != nullptr && context != nullptr && stack != nullptr, "PCRE2: out of memory");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatch& thread_match() {
  thread_local ThreadMatch m;
  return m;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? str_cat("PCRE2 error ", code) : std::string(reinterpret_cast<const char*>(buf), n);
}

bool is_ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

std::string pcre2_pattern(std::string_view p, const std::string& where) {
  const auto refuse = [&](size_t at, const std::string& what) {
    ST_BAD_INPUT(where, " is \"", excerpt(p), "\": ", what, " at offset ", at,
                 " means different things in Oniguruma (Hugging Face) and PCRE2, so the split would not be "
                 "Hugging Face's; expected a pattern without it");
  };
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // offset just after the '[' (and a '^') that opened the class
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      switch (d) {
        case 's':
          out += in_class ? std::string(kWhiteSpace) : str_cat("[", kWhiteSpace, "]");
          break;
        case 'S':
          if (in_class) refuse(i, "\\S inside a character class");
          out += str_cat("[^", kWhiteSpace, "]");
          break;
        case 'w':
        case 'W':
        case 'b':
        case 'B':
        case 'h':
        case 'H':
        case 'Q':
        case 'E':
          refuse(i, str_cat("\\", d));
          break;
        default:
          out += c;
          out += d;
      }
      ++i;
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // a POSIX class such as [:alpha:], copied whole
        const size_t close = p.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out.append(p.substr(i, close + 2 - i));
          i = close + 1;
          continue;
        }
      }
      if (c == ']' && i > class_start) in_class = false;  // a ']' first in the class is a literal
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      class_start = i + 1;
      continue;
    }
    if (c == '(' && i + 2 < p.size() && p[i + 1] == '?' && (is_ascii_letter(p[i + 2]) || p[i + 2] == '-')) {
      size_t j = i + 2;
      while (j < p.size() && (is_ascii_letter(p[j]) || p[j] == '-')) {
        if (p[j] != 'i' && p[j] != 'x' && p[j] != '-') refuse(i, str_cat("the inline option ", p[j]));
        ++j;
      }
    }
    out += c;
  }
  return out;
}

SplitRegex::SplitRegex(std::string_view pattern, const std::string& where) : where_(where) {
  const std::string translated = pcre2_pattern(pattern, where);
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  ST_CHECK(cc != nullptr, "PCRE2: out of memory");
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &error_offset, cc);
  pcre2_compile_context_free(cc);
  if (code == nullptr) {
    ST_BAD_INPUT(where, " is \"", excerpt(pattern), "\", which PCRE2 does not compile (as \"", excerpt(translated),
                 "\"): ", pcre2_message(error), " at offset ", error_offset, "; expected a valid regex");
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

SplitRegex::~SplitRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool SplitRegex::find(std::string_view text, size_t from, size_t* begin, size_t* end) const {
  ThreadMatch& m = thread_match();
  auto* code = static_cast<const pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The text is valid UTF-8 (the encoder replaced what was not), so PCRE2's own check is skipped.
  const int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), from, 0, m.data, m.context)
                      : pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, m.data, m.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  // rc == 0: the pattern has capture groups that the one-pair match block has no room for; the whole match's
  // offsets are still set.
  if (rc < 0) {
    ST_BAD_INPUT(where_, ": the split regex fails on a text of ", text.size(), " bytes at offset ", from, ": ",
                 pcre2_message(rc));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

size_t SplitRegex::char_length(std::string_view text, size_t at) {
  if (at >= text.size()) return 1;
  const auto b = static_cast<unsigned char>(text[at]);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

}  // namespace st::text

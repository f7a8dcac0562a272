// The one error type and CHECK family of shardtrain.
//
// Policy (see docs/design.md):
//   * Broken invariants and failed library calls throw st::Error of kind kInternal or kFault.
//   * Inputs a user can get wrong (config keys, data files, checkpoints) throw kind kBadInput with a
//     message that names the file or key and the expected vs actual value.
//   * Only main() turns an Error into an exit code (exit_code_for()); library code never calls exit().
//
// Every macro funnels into st::detail::fail(), which prefixes the message with the process identity
// (rank and host, once set_process_identity() has been called) and, except for ST_BAD_INPUT's user-facing
// messages, file:line.
//
// Example:
//   ST_CHECK(n > 0, "empty batch");
//   ST_ENFORCE_EQ(a.size(), b.size());              // prints both values on failure
//   ST_BAD_INPUT("data file ", path, ": token ", tok, " at byte ", off, " >= vocab_size ", vocab);
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace st {

enum class ErrorKind {
  kInternal,  // a bug: an invariant did not hold
  kBadInput,  // config, data or checkpoint the user gave is wrong: retrying will not help
  kFault,     // an environment fault (I/O, peer died, device error): retry from the last checkpoint
};

// Process exit codes; Kubernetes podFailurePolicy keys on these (see README "Exit codes").
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitFault = 75;  // EX_TEMPFAIL
inline constexpr int kExitPreempted = 76;  // SIGTERM/SIGINT (core/preempt.h); checkpoint committed if ckpt.dir set

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

int exit_code_for(ErrorKind kind);

// Concatenates anything that has operator<< into a string.
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// Records who this process is, for error and log prefixes. Called once by the launcher after the
// communicator is up; before that, messages carry the host only.
void set_process_identity(int rank, int world_size);
// "[rank 1/4 host-a]" or "[host-a]".
std::string process_prefix();

namespace detail {
// Throws Error(kind, "<process_prefix()> <file>:<line>: check failed: <expr> (<detail>)"). With no expr (nullptr or
// "") the message ends "<file>:<line>: <detail>"; with no file (nullptr) it is "<process_prefix()> <detail>", a
// message for the user that names what they gave.
[[noreturn]] void fail(ErrorKind kind, const char* file, int line, const char* expr, const std::string& detail);
}  // namespace detail

}  // namespace st

#define ST_CHECK(cond, ...)                                                                          \
  do {                                                                                               \
    if (!(cond)) ::st::detail::fail(::st::ErrorKind::kInternal, __FILE__, __LINE__, #cond,           \
                                    ::st::str_cat("" __VA_OPT__(, ) __VA_ARGS__));                   \
  } while (0)

#define ST_ENFORCE_OP_(a, b, op)                                                                     \
  do {                                                                                               \
    const auto& st_a_ = (a);                                                                         \
    const auto& st_b_ = (b);                                                                         \
    if (!(st_a_ op st_b_))                                                                           \
      ::st::detail::fail(::st::ErrorKind::kInternal, __FILE__, __LINE__, #a " " #op " " #b,          \
                         ::st::str_cat(#a " = ", st_a_, ", " #b " = ", st_b_));                      \
  } while (0)

#define ST_ENFORCE_EQ(a, b) ST_ENFORCE_OP_(a, b, ==)
#define ST_ENFORCE_NE(a, b) ST_ENFORCE_OP_(a, b, !=)
#define ST_ENFORCE_LT(a, b) ST_ENFORCE_OP_(a, b, <)
#define ST_ENFORCE_LE(a, b) ST_ENFORCE_OP_(a, b, <=)
#define ST_ENFORCE_GT(a, b) ST_ENFORCE_OP_(a, b, >)
#define ST_ENFORCE_GE(a, b) ST_ENFORCE_OP_(a, b, >=)

// A user-facing error: no file:line noise, the message must name the file/key and expected vs actual.
#define ST_BAD_INPUT(...) \
  ::st::detail::fail(::st::ErrorKind::kBadInput, nullptr, 0, nullptr, ::st::str_cat(__VA_ARGS__))

// An environment fault (I/O error, dead peer): the run may be retried from its last checkpoint.
#define ST_FAULT(...) ::st::detail::fail(::st::ErrorKind::kFault, __FILE__, __LINE__, "", ::st::str_cat(__VA_ARGS__))

// Every writer of a user-named output writes only new files: a target that exists is refused before anything is
// written (kBadInput naming it), and the finished file takes its name by a rename that never replaces what another
// process put there meanwhile. The writers and their rules are listed in docs/checkpoints.md ("Outputs").
//
//   refuse_existing(out, "ckpt export --out");          // before the work
//   ... write out + ".tmp-<pid>", fsync it ...
//   if (const int err = rename_no_replace(tmp, out)) ...  // EEXIST: out appeared since the check
#pragma once

#include <string>

namespace st {

// True if anything is at `path`: a file, a directory, a symbolic link (dangling or not).
bool path_exists(const std::string& path);

// kBadInput "<what> <path>: exists; ..." if anything is at `path`.
void refuse_existing(const std::string& path, const std::string& what);

// Gives `from` the name `to` unless something is at `to`: renameat2(RENAME_NOREPLACE), or on a file system without
// it, link(2) then unlink(2) for a file and, for a directory, rename(2) after checking `to` is absent. Returns 0, or
// the errno of the failure: EEXIST when `to` exists. Makes nothing durable (fsync the directory after).
int rename_no_replace(const std::string& from, const std::string& to);

}  // namespace st

#include "shardtrain/ckpt/replica_resume.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/file_transfer.h"
#include "shardtrain/comm/on_all_ranks.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"

namespace fs = std::filesystem;

namespace st {
namespace {

// A fingerprint of one save: the step and every file's name, size and digest (node_local differs between copies).
std::string save_fingerprint(const Manifest& m) {
  std::string text = str_cat(m.step, " ", m.digest_piece_bytes, "\n");
  for (const ManifestFile& f : m.files) text += str_cat(f.name, " ", f.bytes, " ", f.digest, "\n");
  return sha256_hex(text.data(), text.size());
}

// "rank_00002.h5, rank_00003.h5", at most 8 names.
std::string file_list(const std::vector<int>& files, const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < files.size() && i < 8; ++i) out += (i ? ", " : "") + names[static_cast<size_t>(files[i])];
  if (files.size() > 8) out += str_cat(" and ", files.size() - 8, " more");
  return out;
}

std::string node_list(const std::vector<int>& nodes) {
  std::string out;
  for (size_t i = 0; i < nodes.size(); ++i) out += (i ? ", " : "") + std::to_string(nodes[i]);
  return out;
}

// One save of one step, as every node holds it.
struct Candidate {
  int64_t step = 0;
  std::string save;
  std::vector<int> holders;            // nodes with a copy, ascending
  std::vector<std::set<int>> held_by;  // by file: the nodes that hold it
  std::vector<std::string> names;
  std::vector<int> lost() const {
    std::vector<int> out;
    for (size_t f = 0; f < held_by.size(); ++f)
      if (held_by[f].empty()) out.push_back(static_cast<int>(f));
    return out;
  }
};

// Every (step, save) that some node holds, newest step first; for one step, the copy held by more nodes (then the
// one of the lowest node) first.
std::vector<Candidate> candidates(const std::vector<NodeInventory>& nodes) {
  std::map<std::pair<int64_t, std::string>, Candidate> by_save;
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (const StepHolding& h : nodes[n]) {
      Candidate& c = by_save[{h.step, h.save}];
      c.step = h.step;
      c.save = h.save;
      c.names = h.names;
      c.held_by.resize(static_cast<size_t>(h.files));
      c.holders.push_back(static_cast<int>(n));
      for (int f : h.held) c.held_by[static_cast<size_t>(f)].insert(static_cast<int>(n));
    }
  }
  std::vector<Candidate> out;
  for (auto& [key, c] : by_save) out.push_back(std::move(c));
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.step != b.step) return a.step > b.step;
    if (a.lost().size() != b.lost().size()) return a.lost().size() < b.lost().size();
    if (a.holders.size() != b.holders.size()) return a.holders.size() > b.holders.size();
    return a.holders.front() < b.holders.front();
  });
  return out;
}

std::string describe_loss(const Candidate& c) {
  const std::vector<int> lost = c.lost();
  return str_cat(step_dir_name(c.step), " has lost ", file_list(lost, c.names), " (", lost.size(), " of its ",
                 c.held_by.size(), " rank files are in no node's directory, as a primary or a replica; node(s) ",
                 node_list(c.holders), " hold the rest)");
}

}  // namespace

NodeInventory scan_node_dir(const std::string& dir) {
  NodeInventory inv;
  for (const std::string& step_dir : committed_checkpoints(dir)) {
    Manifest m;
    try {
      m = read_manifest((fs::path(step_dir) / "manifest.json").string());
    } catch (const Error& e) {
      ST_LOG_WARN("checkpoint: ignoring ", step_dir, " for resume: ", e.what());
      continue;
    }
    StepHolding h;
    h.step = m.step;
    h.save = save_fingerprint(m);
    h.files = m.world_size;
    for (const ManifestFile& f : m.files) {
      h.names.push_back(f.name);
      std::error_code ec;
      const fs::path p = fs::path(step_dir) / f.name;
      if (fs::is_regular_file(p, ec) && static_cast<int64_t>(fs::file_size(p, ec)) == f.bytes && !ec)
        h.held.push_back(f.rank);
    }
    inv.push_back(std::move(h));
  }
  return inv;
}

std::string inventory_to_text(const NodeInventory& inv) {
  nlohmann::json j = nlohmann::json::array();
  for (const StepHolding& h : inv)
    j.push_back({{"step", h.step}, {"save", h.save}, {"files", h.files}, {"held", h.held}, {"names", h.names}});
  return j.dump();
}

NodeInventory inventory_from_text(const std::string& text) {
  NodeInventory inv;
  if (text.empty()) return inv;
  for (const nlohmann::json& j : nlohmann::json::parse(text)) {
    StepHolding h;
    h.step = j.at("step").get<int64_t>();
    h.save = j.at("save").get<std::string>();
    h.files = j.at("files").get<int>();
    h.held = j.at("held").get<std::vector<int>>();
    h.names = j.at("names").get<std::vector<std::string>>();
    inv.push_back(std::move(h));
  }
  return inv;
}

ResumeChoice choose_resume(const std::vector<NodeInventory>& nodes, std::optional<int64_t> wanted,
                           const std::string& what) {
  const std::vector<Candidate> all = candidates(nodes);
  const Candidate* newest_complete = nullptr;
  for (const Candidate& c : all) {
    if (c.lost().empty()) {
      newest_complete = &c;
      break;
    }
  }
  const std::string fallback = newest_complete
                                   ? str_cat("the newest complete checkpoint is ", step_dir_name(newest_complete->step))
                                   : std::string("no checkpoint is complete");
  auto chosen = [](const Candidate& c) {
    ResumeChoice r;
    r.step = c.step;
    r.save = c.save;
    r.reference_node = c.holders.front();
    return r;
  };
  if (wanted) {
    const Candidate* best = nullptr;
    for (const Candidate& c : all) {
      if (c.step == *wanted) {
        best = &c;  // the first of a step is its most complete copy
        break;
      }
    }
    if (best == nullptr)
      ST_BAD_INPUT(what, ": no node holds a committed ", step_dir_name(*wanted), "; ", fallback,
                   newest_complete ? " (ckpt.resume=auto resumes from it)" : "");
    if (!best->lost().empty())
      ST_BAD_INPUT(what, ": ", describe_loss(*best), ". Lost files cannot be restored; ", fallback,
                   newest_complete ? " (ckpt.resume=auto resumes from it)" : "");
    return chosen(*best);
  }
  if (all.empty()) return ResumeChoice{};
  if (newest_complete == nullptr) {
    std::string losses;
    int64_t last_step = -1;
    for (const Candidate& c : all) {
      if (c.step == last_step) continue;  // one line a step: its most complete copy
      last_step = c.step;
      losses += (losses.empty() ? "" : "; ") + describe_loss(c);
    }
    ST_BAD_INPUT(what, ": no checkpoint in the node-local ckpt.dirs is complete: ", losses,
                 ". Lost files cannot be restored: start from step 0 with ckpt.resume=none (or move the directories "
                 "aside)");
  }
  ResumeChoice r = chosen(*newest_complete);
  std::string skipped;
  int64_t last_step = -1;
  for (const Candidate& c : all) {
    if (&c == newest_complete) break;
    if (c.step == last_step || c.step == newest_complete->step) continue;
    last_step = c.step;
    skipped += (skipped.empty() ? "" : "; ") + describe_loss(c);
  }
  if (!skipped.empty())
    r.warning = str_cat("checkpoint: ", skipped, ". Resuming from ", step_dir_name(r.step.value()),
                        " instead, the newest checkpoint whose every file some node holds");
  return r;
}

std::vector<std::vector<int>> files_to_hold(const Manifest& m, const NodeLayout& layout) {
  const int world = static_cast<int>(layout.node_of.size());
  std::vector<std::set<int>> want(static_cast<size_t>(layout.nodes));
  for (int r = 0; r < world; ++r) {
    std::set<int>& node = want[static_cast<size_t>(layout.node_of[static_cast<size_t>(r)])];
    for (size_t u = 0; u < m.units.size(); ++u) {
      const ShardSpan mine = shard_span(m.units[u].numel, r, world);
      for (const ManifestFile& f : m.files)
        if (intersect(mine, f.spans[u]).count > 0) node.insert(f.rank);
    }
  }
  if (world == m.world_size) {
    for (int n = 0; n < layout.nodes; ++n) {
      for (int r : layout.ranks[static_cast<size_t>(n)]) want[static_cast<size_t>(n)].insert(r);
      for (int r : layout.ranks[static_cast<size_t>((n + 1) % layout.nodes)]) want[static_cast<size_t>(n)].insert(r);
    }
  }
  std::vector<std::vector<int>> out;
  for (const std::set<int>& s : want) out.emplace_back(s.begin(), s.end());
  return out;
}

std::vector<FileMove> plan_restore(const Manifest& m, const NodeLayout& layout,
                                   const std::vector<std::vector<int>>& held) {
  const std::vector<std::vector<int>> want = files_to_hold(m, layout);
  std::vector<FileMove> moves;
  for (int to = 0; to < layout.nodes; ++to) {
    const std::vector<int>& mine = held[static_cast<size_t>(to)];
    for (int f : want[static_cast<size_t>(to)]) {
      if (std::binary_search(mine.begin(), mine.end(), f)) continue;
      int from = -1;
      for (int n = 0; n < layout.nodes && from < 0; ++n) {
        const std::vector<int>& theirs = held[static_cast<size_t>(n)];
        if (std::binary_search(theirs.begin(), theirs.end(), f)) from = n;
      }
      ST_CHECK(from >= 0, "plan_restore: file ", f, " of step ", m.step, " is held by no node");
      moves.push_back(FileMove{f, from, to});
    }
  }
  return moves;
}

namespace {

// Every rank's text to every rank (a broadcast from each rank in turn): the leaders' inventories.
std::vector<std::string> all_texts(Communicator& comm, const std::string& mine) {
  std::vector<std::string> out(static_cast<size_t>(comm.world_size()));
  for (int r = 0; r < comm.world_size(); ++r) {
    std::string& text = out[static_cast<size_t>(r)];
    int64_t bytes = comm.rank() == r ? static_cast<int64_t>(mine.size()) : 0;
    comm.broadcast(&bytes, sizeof(bytes), r);
    text = comm.rank() == r ? mine : std::string(static_cast<size_t>(bytes), '\0');
    if (bytes > 0) comm.broadcast(text.data(), bytes, r);
  }
  return out;
}

// The step a ckpt.resume path names, which must be a step directory of this node's ckpt.dir.
int64_t named_step(const std::string& resume, const std::string& dir, int node) {
  const fs::path path = fs::path(node_ckpt_dir(resume, node)).lexically_normal();
  const fs::path named = path.filename().empty() ? path.parent_path() : path;
  static const std::regex name_re("step_([0-9]{8})");
  std::smatch match;
  const std::string name = named.filename().string();
  const bool in_dir = fs::weakly_canonical(named.parent_path()) == fs::weakly_canonical(dir);
  if (!std::regex_match(name, match, name_re) || !in_dir)
    ST_BAD_INPUT("ckpt.resume '", resume,
                 "': with ckpt.replicas=1 it must name a step directory (step_XXXXXXXX) of "
                 "ckpt.dir ('",
                 dir, "' on node ", node,
                 "), where the nodes restore each other's files; use the "
                 "same path on every machine, or {node} as in ckpt.dir");
  return std::stoll(match[1].str());
}

// Node `node`'s leader: builds the step directory anew from the files it still holds (hard links, or copies where
// the filesystem has none) and the received ones, with the reference manifest naming this node's files.
class Restore {
 public:
  Restore(const std::string& dir, const Manifest& m, const std::vector<int>& held, int node, const NodeLayout& layout,
          const std::string& nonce)
      : m_(m), node_(node) {
    final_ = fs::path(dir) / step_dir_name(m.step);
    tmp_ = fs::path(dir) / (step_dir_name(m.step) + ".tmp-" + nonce);
    std::error_code ec;
    fs::remove_all(tmp_, ec);
    fs::create_directories(tmp_, ec);
    if (ec) ST_FAULT("cannot create ", tmp_.string(), ": ", ec.message());
    for (int f : held) {
      const fs::path from = final_ / m.files[static_cast<size_t>(f)].name, to = tmp_ / from.filename();
      fs::create_hard_link(from, to, ec);
      if (ec) fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
      if (ec) ST_FAULT("cannot link or copy ", from.string(), " to ", to.string(), ": ", ec.message());
    }
    if (m.world_size == static_cast<int>(layout.node_of.size()))
      for (int r : layout.ranks[static_cast<size_t>(node)]) primaries_.insert(r);
  }
  std::string path_of(int file) const { return (tmp_ / m_.files[static_cast<size_t>(file)].name).string(); }

  // The manifest, with node_local naming what this directory holds, then the rename into place.
  std::string commit(std::vector<int> holds, int nodes, const std::string& nonce) {
    std::sort(holds.begin(), holds.end());
    Manifest m = m_;
    ManifestNodeLocal nl;
    nl.node = node_;
    nl.nodes = nodes;
    for (int f : holds) (primaries_.count(f) ? nl.primaries : nl.replicas).push_back(f);
    m.node_local = std::move(nl);
    write_file_atomic((tmp_ / "manifest.json").string(), manifest_to_json(m));
    fsync_path(tmp_.string());
    fs::path old;
    std::error_code ec;
    if (fs::exists(final_, ec)) {
      old = final_;
      old += ".old-" + nonce;
      fs::rename(final_, old, ec);
      if (ec) ST_FAULT("cannot move ", final_.string(), " aside: ", ec.message());
    }
    fs::rename(tmp_, final_, ec);
    if (ec) ST_FAULT("cannot rename ", tmp_.string(), " to ", final_.string(), ": ", ec.message());
    fsync_path(final_.parent_path().string());
    if (!old.empty()) fs::remove_all(old, ec);
    return final_.string();
  }

 private:
  const Manifest& m_;
  int node_;
  fs::path final_, tmp_;
  std::set<int> primaries_;
};

}  // namespace

std::optional<std::string> resume_node_local(const Config& cfg, ModelBackend& model, Communicator& comm) {
  const CkptConfig& c = cfg.ckpt;
  if (c.resume == "none" || (c.resume == "auto" && c.dir.empty())) return std::nullopt;
  const NodeLayout layout = node_layout(comm);
  check_replica_layout(layout);
  check_replica_sharding(model, comm);
  const int node = comm.node_id();
  const bool leader = comm.local_rank() == 0;
  const std::string dir = node_ckpt_dir(c.dir, node);
  const std::string what = c.resume == "auto" ? std::string("ckpt.resume=auto") : "ckpt.resume '" + c.resume + "'";

  // 1. Inventories.
  std::optional<int64_t> wanted;
  std::string mine;
  on_all_ranks(comm, [&] {
    check_latest_file(dir);
    if (c.resume != "auto") wanted = named_step(c.resume, dir, node);
    if (leader) mine = inventory_to_text(scan_node_dir(dir));
  });
  const std::vector<std::string> texts = all_texts(comm, mine);
  std::vector<NodeInventory> inventories(static_cast<size_t>(layout.nodes));
  for (int n = 0; n < layout.nodes; ++n)
    inventories[static_cast<size_t>(n)] =
        inventory_from_text(texts[static_cast<size_t>(layout.ranks[static_cast<size_t>(n)][0])]);

  // 2. The agreement: the same inputs on every rank, so the same choice or the same error.
  const ResumeChoice choice = choose_resume(inventories, wanted, what);
  if (!choice.step) {
    if (comm.rank() == 0) ST_LOG_INFO(what, ": no committed checkpoint in any node's ckpt.dir: starting fresh");
    return std::nullopt;
  }
  if (comm.rank() == 0 && !choice.warning.empty()) ST_LOG_WARN(choice.warning);
  const std::string step_name = step_dir_name(*choice.step);

  // The reference copy's manifest, from its node's leader to every rank.
  const int ref_rank = layout.ranks[static_cast<size_t>(choice.reference_node)][0];
  std::string manifest_text;
  on_all_ranks(comm, [&] {
    if (comm.rank() == ref_rank) manifest_text = read_file((fs::path(dir) / step_name / "manifest.json").string());
  });
  int64_t bytes = static_cast<int64_t>(manifest_text.size());
  comm.broadcast(&bytes, sizeof(bytes), ref_rank);
  manifest_text.resize(static_cast<size_t>(bytes));
  comm.broadcast(manifest_text.data(), bytes, ref_rank);
  const Manifest m =
      manifest_from_json(manifest_text, str_cat("node ", choice.reference_node, "'s ", step_name, "/manifest.json"));

  // 3. Restore: what each node holds of this save, what it must hold, and the moves between leaders.
  std::vector<std::vector<int>> held(static_cast<size_t>(layout.nodes));
  for (int n = 0; n < layout.nodes; ++n)
    for (const StepHolding& h : inventories[static_cast<size_t>(n)])
      if (h.step == *choice.step && h.save == choice.save) held[static_cast<size_t>(n)] = h.held;
  const std::vector<FileMove> moves = plan_restore(m, layout, held);
  uint64_t bits = 0;
  if (comm.rank() == 0) bits = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  comm.broadcast(&bits, sizeof(bits), 0);
  char nonce[20];
  std::snprintf(nonce, sizeof(nonce), "%016llx", static_cast<unsigned long long>(bits));

  const bool receives =
      leader && std::any_of(moves.begin(), moves.end(), [&](const FileMove& mv) { return mv.to == node; });
  std::unique_ptr<Restore> restore;
  std::string error;  // this leader's first failure; the moves go on so that no peer waits for a transfer
  if (receives) {
    try {
      restore = std::make_unique<Restore>(dir, m, held[static_cast<size_t>(node)], node, layout, nonce);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  int64_t received_bytes = 0;
  std::vector<int> received;
  for (const FileMove& mv : moves) {
    if (!leader || (mv.from != node && mv.to != node)) continue;
    const int peer = layout.ranks[static_cast<size_t>(mv.from == node ? mv.to : mv.from)][0];
    const ManifestFile& f = m.files[static_cast<size_t>(mv.file)];
    try {
      if (mv.from == node) {
        const FileOffer offer{f.rank, (fs::path(dir) / step_name / f.name).string(), f.bytes, f.digest,
                              m.digest_piece_bytes};
        transfer_files(comm, peer, &offer, -1, nullptr, nullptr);
      } else {
        FileTake take;
        const std::string sink = restore ? std::string() : "/dev/null";
        transfer_files(comm, -1, nullptr, peer, &take,
                       [&](int file) { return restore ? restore->path_of(file) : sink; });
        if (take.file != f.rank || take.digest != f.digest)
          ST_FAULT("node ", mv.from, " sent file ", take.file, " (SHA-256 ", take.digest, ") for ", f.name, " (",
                   f.digest, ")");
        received.push_back(f.rank);
        received_bytes += f.bytes;
      }
    } catch (const Error& e) {
      if (error.empty()) error = e.what();
    }
  }
  std::string local = (fs::path(dir) / step_name).string();
  on_all_ranks(comm, [&] {
    if (!error.empty()) ST_FAULT("restoring ", step_name, " into node ", node, "'s ckpt.dir ", dir, ": ", error);
    if (!restore) return;
    std::vector<int> holds = held[static_cast<size_t>(node)];
    holds.insert(holds.end(), received.begin(), received.end());
    local = restore->commit(holds, layout.nodes, nonce);
    std::vector<std::string> names;
    for (const ManifestFile& f : m.files) names.push_back(f.name);
    ST_LOG_INFO("checkpoint: restored ", local, " on node ", node,
                " from the other nodes' copies: ", file_list(received, names), " (", received_bytes, " bytes)");
  });
  return local;
}

}  // namespace st

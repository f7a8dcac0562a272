// Checkpoint files from one rank's disk to another's over a communicator's point-to-point calls: the replicas of
// ckpt.replicas = 1 (node_local.h) at each save, and the files a node lost, at resume (replica_resume.h).
//
// A transfer is a header of fixed size (the file's manifest index, its size and digest, or "nothing": the sender
// has no file) and then the bytes, read from the sender's file and written into the receiver's in pieces of at most
// kTransferChunk bytes, so neither side holds the file in memory. The receiver hashes the bytes as they arrive,
// fsyncs the file, and checks its size and digest against the header.
//
// Both halves of a rank's part go at once (Communicator::send_recv), so ranks that each send to one neighbour and
// receive from the other never wait on each other. A local failure (a read or write error, a full disk, a hash that
// does not match) does not stop the exchange half way, which would leave the peer waiting: the sender sends zeros
// for what it could not read, the receiver drops what it cannot write, and the error is thrown (kFault, naming the
// file, the peer and the cause) once every byte has crossed.
//
//   FileOffer mine{file, path, bytes, digest, piece_bytes}; // or FileOffer{} when the write failed
//   FileTake theirs;
//   transfer_files(comm, holder, &mine, source, &theirs, [&](int f) { return dir + "/" + name(f); });
//   if (theirs.received) ...;                               // theirs.file, theirs.bytes, theirs.digest
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "shardtrain/comm/communicator.h"

namespace st {

// The largest piece of a file one send_recv moves: two of these are the transfer's memory.
inline constexpr int64_t kTransferChunk = int64_t{16} << 20;

// What a sender offers: file index -1 is nothing (the header says so and no bytes follow).
struct FileOffer {
  int file = -1;
  std::string path;
  int64_t bytes = 0;
  std::string digest;  // file_digest(path, piece_bytes), lowercase hex
  int64_t piece_bytes = 0;
};

// What a receiver got.
struct FileTake {
  bool received = false;  // false: the sender had nothing
  int file = -1;
  int64_t bytes = 0;
  std::string digest;  // the sender's, which the received bytes matched
  std::string path;    // where it was written
};

// Sends `offer` to rank `dest` and receives into `take` from rank `source`, at once; either side may be absent
// (null, with its rank -1). `path_for(file)` names the file a received header announces; it is created or
// truncated. The peers must make the matching calls (dest's with this rank as source, and so on). A failure to
// read, write or verify throws kFault after the exchange has ended on both sides; a broken peer throws at once.
void transfer_files(Communicator& comm, int dest, const FileOffer* offer, int source, FileTake* take,
                    const std::function<std::string(int file)>& path_for);

}  // namespace st

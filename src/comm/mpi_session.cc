#include "shardtrain/comm/mpi_session.h"

#include <cstdio>
#include <cstdlib>

#include "shardtrain/comm/mpi_check.h"
#include "shardtrain/comm/mpi_include.h"
#include "shardtrain/core/env.h"
#include "shardtrain/core/log.h"

namespace st {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  int finalized = 0;
  ST_MPI_CHECK(MPI_Initialized(&initialized));
  ST_MPI_CHECK(MPI_Finalized(&finalized));
  ST_CHECK(!initialized, "MPI is already initialised: only one MpiSession per process");
  ST_CHECK(!finalized, "MPI was finalised: it cannot be initialised again in this process");
  ST_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_));
  if (thread_level_ < MPI_THREAD_MULTIPLE) {
    ST_LOG_INFO("MPI provides ", thread_level_name(thread_level_),
                " (asked for MPI_THREAD_MULTIPLE): call communicators from one thread at a time");
  }
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();  // a destructor does not throw; a failing finalize has nothing to undo
}

bool MpiSession::launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) {
    if (!env_get(var).empty()) return true;
  }
  return false;
}

void MpiSession::abort(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  // Without MPI (or should MPI_Abort return) this process is the whole job.
  std::_Exit(exit_code);
}

}  // namespace st

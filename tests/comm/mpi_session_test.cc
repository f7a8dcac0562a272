// What can be tested of the MPI pieces without a launcher: the environment test that decides whether to
// initialise MPI at all, and ST_MPI_CHECK's error path. The collectives run under mpirun
// (tests/tools/mpi_comm_check.cc, ctest -L mpi).
#include "shardtrain/comm/mpi_session.h"

#include <gtest/gtest.h>

#include <string>

#include "env_guard.h"
#include "shardtrain/comm/mpi_check.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

TEST(MpiSessionTest, LaunchedByMpiReadsTheLaunchersVariables) {
  testing::EnvGuard env;
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) env.clear(v);
  EXPECT_FALSE(MpiSession::launched_by_mpi());
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) {
    env.set(v, "0");
    EXPECT_TRUE(MpiSession::launched_by_mpi()) << v;
    env.clear(v);
    EXPECT_FALSE(MpiSession::launched_by_mpi()) << v;
  }
  env.set("PMI_SIZE", "");  // set but empty counts as unset, as for every variable of the table
  EXPECT_FALSE(MpiSession::launched_by_mpi());
}

int returns(int code) { return code; }

TEST(MpiCheckTest, FailureIsAFaultWithExpressionAndCode) {
  EXPECT_NO_THROW(ST_MPI_CHECK(returns(MPI_SUCCESS)));
  try {
    ST_MPI_CHECK(returns(MPI_ERR_COUNT));
    ADD_FAILURE() << "ST_MPI_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFault);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("returns(MPI_ERR_COUNT)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MPI error code " + std::to_string(MPI_ERR_COUNT)), std::string::npos) << msg;
    EXPECT_NE(msg.find("mpi_session_test.cc:"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace st

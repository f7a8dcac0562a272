// ST_MPI_CHECK: the MPI member of the CHECK family (core/error.h).
//
// A failed MPI call throws st::Error of kind kFault whose message carries the process identity,
// file:line, the expression and MPI's own text for the code (MPI_Error_string). MPI only returns codes
// instead of aborting on communicators whose error handler is MPI_ERRORS_RETURN; MpiCommunicator sets
// that on its communicator.
//
//   ST_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, comm));
#pragma once

#include <string>

#include "shardtrain/comm/mpi_include.h"
#include "shardtrain/core/error.h"

namespace st::detail {

// "MPI_ERR_COUNT: invalid count argument (code 2)"-style text for an MPI error code. Safe to call before
// MPI_Init and after MPI_Finalize (then it gives the code and class number only).
std::string mpi_error_text(int code);

}  // namespace st::detail

#define ST_MPI_CHECK(expr)                                                   \
  do {                                                                       \
    const int st_mpi_rc_ = (expr);                                           \
    if (st_mpi_rc_ != MPI_SUCCESS)                                           \
      ::st::detail::fail(::st::ErrorKind::kFault, __FILE__, __LINE__, #expr, \
                         ::st::detail::mpi_error_text(st_mpi_rc_));          \
  } while (0)

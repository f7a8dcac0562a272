#include "shardtrain/comm/mpi_check.h"

namespace st::detail {

std::string mpi_error_text(int code) {
  // MPI_Error_string is only defined between MPI_Init and MPI_Finalize (Open MPI fills its tables in
  // MPI_Init); outside that window the code is all we have.
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return str_cat("MPI error code ", code, " (MPI not initialised)");
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return str_cat("MPI error code ", code);
  int error_class = -1;
  MPI_Error_class(code, &error_class);
  return str_cat(std::string(text, static_cast<size_t>(len)), " (MPI error code ", code, ", class ", error_class, ")");
}

}  // namespace st::detail

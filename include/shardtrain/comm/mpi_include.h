// The one way shardtrain includes <mpi.h>: without MPI's deprecated C++ bindings (namespace MPI), which
// C++ translation units would otherwise pull in and which need libmpi_cxx at link time. We link only the
// C library (MPI::MPI_C). Include this instead of <mpi.h>, before anything else that might include it.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

// <mpi.h> with the C API only: the deprecated MPI C++ bindings that Open MPI and
// MPICH pull in for C++ code would need libmpi_cxx, which shardlm does not link.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

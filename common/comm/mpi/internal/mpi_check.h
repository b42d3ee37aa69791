// mpi_check.h: MPI's C API for the mpi backend's sources, and MPI_CHECK, the
// one way they call it.
#pragma once

// The C API only: OpenMPI's deprecated C++ bindings are not used here.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <string>

#include "check.h"

namespace zf {

// MPI's own words for an error code.
inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, size_t(len));
}

}  // namespace zf

// MPI_CHECK(call): throw zf::Error("file:line [rank r] call failed: <MPI's message>").
#define MPI_CHECK(call)                                                                   \
  do {                                                                                    \
    const int zf_mpi_rc_ = (call);                                                        \
    if (zf_mpi_rc_ != MPI_SUCCESS)                                                        \
      ::zf::fail_at(__FILE__, __LINE__,                                                   \
                    std::string(#call) + " failed: " + ::zf::mpi_error_text(zf_mpi_rc_)); \
  } while (0)

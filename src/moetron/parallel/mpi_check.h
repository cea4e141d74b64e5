// MPI_CHECK(call): runs an MPI call and throws moetron::Error ("[mpi] <call> failed: <MPI's error
// string>", with file and line) when it does not return MPI_SUCCESS. Our communicators set
// MPI_ERRORS_RETURN so that errors reach this check instead of aborting inside MPI.
#pragma once

#include <mpi.h>

#include <string>

#include "moetron/core/error.h"

namespace moetron::parallel {

inline std::string mpi_error_string(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
    return std::string(text, static_cast<size_t>(length));
}

}  // namespace moetron::parallel

#define MPI_CHECK(call)                                                                 \
    do {                                                                                \
        const int mt_mpi_code_ = (call);                                                \
        if (mt_mpi_code_ != MPI_SUCCESS) [[unlikely]] {                                 \
            ::moetron::detail::check_failed(                                            \
                __FILE__, __LINE__, #call,                                              \
                "[mpi] " + std::string(#call).substr(0, std::string(#call).find('(')) + \
                    " failed: " + ::moetron::parallel::mpi_error_string(mt_mpi_code_) + \
                    " (code " + std::to_string(mt_mpi_code_) + ")");                    \
        }                                                                               \
    } while (0)

// The shared main() of the MPI test executables (mpi_test_main.cpp): one MpiSession and one world
// communicator for the whole run, reachable from the tests through these functions.
#pragma once

#include "moetron/parallel/communicator.h"

namespace moetron::testing {

// Timeout of the world communicator: long enough for an oversubscribed machine, short enough that
// a test that desynchronizes the ranks fails instead of hanging.
inline constexpr double kMpiTestTimeoutS = 60.0;

parallel::Communicator& mpi_world();
const parallel::MpiSession& mpi_session();

}  // namespace moetron::testing

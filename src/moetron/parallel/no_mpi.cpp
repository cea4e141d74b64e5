// Built in place of the mpi_*.cpp files when CMake finds no MPI: every entry point into MPI says
// so instead of failing to link. LocalCommunicator (a world of one process) still works.
#include <cstdlib>

#include "moetron/core/error.h"
#include "moetron/parallel/communicator.h"

namespace moetron::parallel {

MpiSession::MpiSession(int*, char***) {
    MT_THROW("[mpi] moetron was built without MPI: install libopenmpi-dev and rebuild");
}

MpiSession::~MpiSession() = default;

void MpiSession::abort_job(int exit_code) {
    std::exit(exit_code);
}

std::unique_ptr<Communicator> make_mpi_world(const MpiSession&, const CommunicatorOptions&) {
    MT_THROW("[mpi] moetron was built without MPI: install libopenmpi-dev and rebuild");
}

}  // namespace moetron::parallel

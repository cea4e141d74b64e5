// Redundant experts' gradients: the replicas of one logical expert (parallel/expert_placement.h)
// see different tokens, so each computes part of the expert's gradient. Summing those parts over
// the EP group, before the expert-data-parallel reduction and the optimizer, gives every replica
// the whole gradient, bit for bit the same: one all-reduce result lands on every rank, and the
// optimizer then applies one identical update to identical weights and moments, so the replicas
// stay identical.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moetron/parallel/communicator.h"
#include "moetron/parallel/expert_placement.h"

namespace moetron::parallel {

// One tensor of a MoE layer's routed experts on this rank: (slots_per_rank, floats_per_slot).
struct SlotTensor {
    float* data = nullptr;
    int64_t floats_per_slot = 0;
};

class ReplicaGradientSum {
  public:
    // floats_per_expert: the floats of one expert over all its tensors (what one layer sums per
    // replicated expert). Sizes its exchange buffer for the most experts that can be replicated
    // (R, the spare slots), so that a new placement needs no allocation.
    ReplicaGradientSum(const PlacementShape& shape, int64_t floats_per_expert);

    // Sums, over the EP group `ep` (this rank: ep.rank()), the gradients of every replicated
    // expert's replicas in `tensors` (this rank's slots of one MoE layer) and writes the sum back
    // into each replica. A collective over ep: every rank calls it for the same layers in the
    // same order. Nothing to do (no communication) when no expert has two replicas.
    void sum(const ExpertPlacement& placement, std::span<const SlotTensor> tensors,
             Communicator& ep);

  private:
    int64_t floats_per_expert_ = 0;
    std::vector<float> pack_;  // (R * floats_per_expert)
};

}  // namespace moetron::parallel

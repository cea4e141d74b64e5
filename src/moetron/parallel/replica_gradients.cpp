#include "moetron/parallel/replica_gradients.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::parallel {

ReplicaGradientSum::ReplicaGradientSum(const PlacementShape& shape, int64_t floats_per_expert)
    : floats_per_expert_(floats_per_expert),
      pack_(static_cast<size_t>((shape.num_slots - shape.num_experts) * floats_per_expert)) {}

void ReplicaGradientSum::sum(const ExpertPlacement& placement, std::span<const SlotTensor> tensors,
                             Communicator& ep) {
    int64_t per_expert = 0;
    for (const SlotTensor& t : tensors) per_expert += t.floats_per_slot;
    MT_CHECK(per_expert == floats_per_expert_,
             "[replica_gradients] the tensors hold {} floats per expert, the sum was sized for {}",
             per_expert, floats_per_expert_);
    const int64_t slots_per_rank = placement.shape.slots_per_rank();
    const int64_t first_slot = static_cast<int64_t>(ep.rank()) * slots_per_rank;
    // The replicated experts in ascending order: expert e's region of the pack is its index among
    // them. Every rank adds its replicas' gradients into their regions (zeros elsewhere).
    int64_t replicated = 0;
    std::fill(pack_.begin(), pack_.end(), 0.0f);
    for (int64_t e = 0; e < placement.shape.num_experts; ++e) {
        if (placement.replicas(e) < 2) continue;
        MT_CHECK((replicated + 1) * per_expert <= static_cast<int64_t>(pack_.size()),
                 "[replica_gradients] more replicated experts than spare slots");
        float* region = pack_.data() + replicated * per_expert;
        for (int32_t slot : placement.slots_of(e)) {
            const int64_t local = slot - first_slot;
            if (local < 0 || local >= slots_per_rank) continue;
            float* out = region;
            for (const SlotTensor& t : tensors) {
                const float* g = t.data + local * t.floats_per_slot;
                for (int64_t i = 0; i < t.floats_per_slot; ++i) out[i] += g[i];
                out += t.floats_per_slot;
            }
        }
        ++replicated;
    }
    if (replicated == 0) return;
    ep.all_reduce_sum(std::span<float>(pack_.data(), static_cast<size_t>(replicated * per_expert)),
                      kHostStream);
    replicated = 0;
    for (int64_t e = 0; e < placement.shape.num_experts; ++e) {
        if (placement.replicas(e) < 2) continue;
        const float* region = pack_.data() + replicated * per_expert;
        for (int32_t slot : placement.slots_of(e)) {
            const int64_t local = slot - first_slot;
            if (local < 0 || local >= slots_per_rank) continue;
            const float* in = region;
            for (const SlotTensor& t : tensors) {
                std::copy(in, in + t.floats_per_slot, t.data + local * t.floats_per_slot);
                in += t.floats_per_slot;
            }
        }
        ++replicated;
    }
}

}  // namespace moetron::parallel

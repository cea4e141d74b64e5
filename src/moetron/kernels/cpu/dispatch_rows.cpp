// The expert dispatch's row movements (dispatch_rows.h): OpenMP over input, staging or token rows,
// so that no two threads write the same row.
#include "moetron/kernels/cpu/dispatch_rows.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace moetron::cpu {

namespace {

constexpr int64_t kBlock = 64;  // floats summed at once: the partial sums stay in registers

// The row of slot `slot` (rows row_size elements wide): in recv for the rank's own slots, else
// in send.
template <class T>
T* slot_row(int32_t slot, T* send, T* recv, int64_t row_size, const SlotPlacement& own) {
    const int64_t offset = slot - own.own_first_slot;
    if (offset >= 0 && offset < own.own_num_slots)
        return recv + (own.own_first_recv_row + offset) * row_size;
    return send + static_cast<int64_t>(slot) * row_size;
}

}  // namespace

void dispatch_fan_out(void* send, void* recv, const void* input, const int32_t* slot_begin,
                      const int32_t* row_slots, int64_t num_inputs, int64_t row_bytes,
                      const SlotPlacement& own) {
    auto* send_bytes = static_cast<std::byte*>(send);
    auto* recv_bytes = static_cast<std::byte*>(recv);
    const auto* input_bytes = static_cast<const std::byte*>(input);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < num_inputs; ++i)
        for (int32_t s = slot_begin[i]; s < slot_begin[i + 1]; ++s)
            std::memcpy(slot_row(row_slots[s], send_bytes, recv_bytes, row_bytes, own),
                        input_bytes + i * row_bytes, static_cast<size_t>(row_bytes));
}

void dispatch_fan_in(float* input, const float* send, const float* recv, const int32_t* slot_begin,
                     const int32_t* row_slots, int64_t num_inputs, int64_t width,
                     const SlotPlacement& own, bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < num_inputs; ++i) {
        float* dst = input + i * width;
        const int32_t first = slot_begin[i], last = slot_begin[i + 1];
        for (int64_t k0 = 0; k0 < width; k0 += kBlock) {
            const int64_t n = std::min(kBlock, width - k0);
            float sum[kBlock] = {};
            for (int32_t s = first; s < last; ++s) {
                const float* src = slot_row(row_slots[s], send, recv, width, own) + k0;
                for (int64_t k = 0; k < n; ++k) sum[k] += src[k];
            }
            for (int64_t k = 0; k < n; ++k)
                dst[k0 + k] = accumulate ? dst[k0 + k] + sum[k] : sum[k];
        }
    }
}

void dispatch_expand(float* expert_rows, const float* staging, const int32_t* copy_begin,
                     const int32_t* copy_row, const float* copy_weight, int64_t num_staging,
                     int64_t dim) {
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < num_staging; ++s) {
        const float* src = staging + s * dim;
        for (int32_t c = copy_begin[s]; c < copy_begin[s + 1]; ++c) {
            float* dst = expert_rows + static_cast<int64_t>(copy_row[c]) * dim;
            if (copy_weight == nullptr) {
                std::memcpy(dst, src, static_cast<size_t>(dim) * sizeof(float));
            } else {
                const float w = copy_weight[c];
                for (int64_t i = 0; i < dim; ++i) dst[i] = w * src[i];
            }
        }
    }
}

void dispatch_reduce(float* staging, const float* expert_rows, const int32_t* copy_begin,
                     const int32_t* copy_row, const float* copy_weight, int64_t num_staging,
                     int64_t dim) {
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < num_staging; ++s) {
        float* dst = staging + s * dim;
        std::fill(dst, dst + dim, 0.0f);
        for (int32_t c = copy_begin[s]; c < copy_begin[s + 1]; ++c) {
            const float* src = expert_rows + static_cast<int64_t>(copy_row[c]) * dim;
            const float w = copy_weight != nullptr ? copy_weight[c] : 1.0f;
            for (int64_t i = 0; i < dim; ++i) dst[i] += w * src[i];
        }
    }
}

void dispatch_weight_grads(float* dweights, const float* dout, const float* expert_out,
                           const int32_t* copy_begin, const int32_t* copy_row,
                           const int32_t* copy_choice, int64_t num_staging, int64_t top_k,
                           int64_t dim) {
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < num_staging; ++s) {
        float* dw = dweights + s * top_k;
        std::fill(dw, dw + top_k, 0.0f);
        for (int32_t c = copy_begin[s]; c < copy_begin[s + 1]; ++c) {
            const float* y = expert_out + static_cast<int64_t>(copy_row[c]) * dim;
            double dot = 0;  // double: D can be 7168 and the sum cancels
            for (int64_t i = 0; i < dim; ++i) dot += static_cast<double>(dout[s * dim + i]) * y[i];
            dw[copy_choice[c]] = static_cast<float>(dot);
        }
    }
}

void unpermute_add(float* out, const float* inp, const float* weights, const int32_t* copy_to_row,
                   int64_t num_tokens, int64_t top_k, int64_t dim) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        float* out_row = out + t * dim;
        for (int64_t d0 = 0; d0 < dim; d0 += kBlock) {
            const int64_t n = std::min(kBlock, dim - d0);
            float sum[kBlock] = {};
            for (int64_t j = 0; j < top_k; ++j) {
                const float w = weights != nullptr ? weights[t * top_k + j] : 1.0f;
                const float* row =
                    inp + static_cast<int64_t>(copy_to_row[t * top_k + j]) * dim + d0;
                for (int64_t d = 0; d < n; ++d) sum[d] += w * row[d];
            }
            for (int64_t d = 0; d < n; ++d) out_row[d0 + d] += sum[d];
        }
    }
}

}  // namespace moetron::cpu

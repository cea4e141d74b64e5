#include "moetron/parallel/dispatch_flat.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "moetron/core/error.h"

namespace moetron::parallel {

void DispatchConfig::validate(int ep_size) const {
    MT_CHECK(ep_size >= 1, "[dispatch] EP group size must be >= 1, got {}", ep_size);
    MT_CHECK(num_experts >= 1, "[dispatch] num_experts must be >= 1, got {}", num_experts);
    MT_CHECK(num_experts % ep_size == 0,
             "[dispatch] the {} experts do not split evenly over an EP group of {} ranks",
             num_experts, ep_size);
    MT_CHECK(top_k >= 1 && top_k <= num_experts, "[dispatch] top_k {} is not in [1, {}]", top_k,
             num_experts);
    MT_CHECK(hidden >= 1, "[dispatch] hidden must be >= 1, got {}", hidden);
    MT_CHECK(max_tokens >= 0, "[dispatch] max_tokens must be >= 0, got {}", max_tokens);
    MT_CHECK(recv_capacity_rows >= 0, "[dispatch] recv_capacity_rows must be >= 0, got {}",
             recv_capacity_rows);
    // all_to_all_v counts and displacements are MPI ints, in floats.
    MT_CHECK(max_tokens * top_k * hidden <= INT_MAX,
             "[dispatch] max_tokens*K*D = {}*{}*{} floats exceed MPI's int count limit; use "
             "smaller micro-batches",
             max_tokens, top_k, hidden);
    MT_CHECK(capacity_rows(ep_size) * hidden <= INT_MAX,
             "[dispatch] receive capacity {} rows x {} floats exceeds MPI's int count limit; set "
             "recv_capacity_rows lower (the worst case is {} rows)",
             capacity_rows(ep_size), hidden, worst_case_recv_rows(ep_size));
}

int64_t DispatchConfig::worst_case_recv_rows(int ep_size) const {
    return ep_size * max_tokens * std::min(top_k, local_experts(ep_size));
}

int64_t DispatchConfig::capacity_rows(int ep_size) const {
    return recv_capacity_rows > 0 ? recv_capacity_rows : worst_case_recv_rows(ep_size);
}

ArenaPlan DispatchBuffer::plan(const DispatchConfig& config, int ep_size) {
    config.validate(ep_size);
    ArenaPlan p("dispatch_buffer");
    p.add("send_rows", Shape{config.max_tokens * config.top_k, config.hidden});
    p.add("staging_rows", Shape{config.capacity_rows(ep_size), config.hidden});
    return p;
}

DispatchBuffer::DispatchBuffer(const DispatchConfig& config, int ep_size)
    : config_(config), ep_size_(ep_size), arena_(plan(config, ep_size), host_memory()) {
    send_rows_ = arena_.view("send_rows").f32();
    staging_rows_ = arena_.view("staging_rows").f32();
}

DispatchLayout::DispatchLayout(const DispatchConfig& config, int ep_size)
    : config_(config), ep_size_(ep_size) {
    config.validate(ep_size);
    local_experts_ = config.local_experts(ep_size);
    const size_t ep = static_cast<size_t>(ep_size);
    copy_to_send_row_.resize(static_cast<size_t>(config.max_tokens * config.top_k));
    send_expert_counts_.resize(static_cast<size_t>(config.num_experts));
    recv_expert_counts_.resize(static_cast<size_t>(config.num_experts));
    staging_to_expert_row_.resize(static_cast<size_t>(config.capacity_rows(ep_size)));
    expert_offsets_.resize(static_cast<size_t>(local_experts_) + 1);
    expert_fill_.resize(static_cast<size_t>(local_experts_));
    for (auto* v : {&send_rows_per_rank_, &recv_rows_per_rank_, &send_counts_, &send_displs_,
                    &recv_counts_, &recv_displs_, &count_exchange_counts_, &count_exchange_displs_})
        v->resize(ep);
    for (size_t p = 0; p < ep; ++p) {
        count_exchange_counts_[p] = static_cast<int>(local_experts_);
        count_exchange_displs_[p] = static_cast<int>(p * static_cast<size_t>(local_experts_));
    }
}

namespace {

void check_group(int layout_ep, const Communicator& ep, const char* op) {
    MT_CHECK(ep.size() == layout_ep,
             "[{}] the layout was planned for an EP group of {} ranks, group '{}' has {}", op,
             layout_ep, ep.name(), ep.size());
}

void check_buffer(const DispatchConfig& layout_config, int layout_ep, const DispatchBuffer& buffer,
                  const char* op) {
    const DispatchConfig& b = buffer.config();
    MT_CHECK(buffer.ep_size() == layout_ep && b.hidden == layout_config.hidden &&
                 b.top_k == layout_config.top_k && b.max_tokens >= layout_config.max_tokens &&
                 b.capacity_rows(layout_ep) >= layout_config.capacity_rows(layout_ep),
             "[{}] the dispatch buffer (D {}, K {}, max_tokens {}, {} rows, ep {}) does not fit "
             "the layout (D {}, K {}, max_tokens {}, {} rows, ep {})",
             op, b.hidden, b.top_k, b.max_tokens, b.capacity_rows(buffer.ep_size()),
             buffer.ep_size(), layout_config.hidden, layout_config.top_k, layout_config.max_tokens,
             layout_config.capacity_rows(layout_ep), layout_ep);
}

void exclusive_prefix_sum(std::span<int> offsets, std::span<const int> counts) {
    int running = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
        offsets[i] = running;
        running += counts[i];
    }
}

}  // namespace

void dispatch_layout(DispatchLayout& layout, const int32_t* topk_ids, int64_t num_tokens,
                     Communicator& ep) {
    const DispatchConfig& cfg = layout.config_;
    check_group(layout.ep_size_, ep, "dispatch_layout");
    MT_CHECK(num_tokens >= 0 && num_tokens <= cfg.max_tokens,
             "[dispatch_layout] {} tokens, but the layout holds at most max_tokens = {}",
             num_tokens, cfg.max_tokens);
    const int64_t K = cfg.top_k, E = cfg.num_experts, El = layout.local_experts_;
    const int64_t num_copies = num_tokens * K;
    const int ep_size = layout.ep_size_;

    // Counting sort of the copies by global expert: stable in the copy index, and destination
    // ranks own contiguous expert ranges, so the order is also grouped by destination.
    std::fill(layout.send_expert_counts_.begin(), layout.send_expert_counts_.end(), 0);
    for (int64_t c = 0; c < num_copies; ++c) {
        const int32_t e = topk_ids[c];
        MT_CHECK(e >= 0 && e < E,
                 "[dispatch_layout] expert id {} of token {} (choice {}) is not in [0, {})", e,
                 c / K, c % K, E);
        ++layout.send_expert_counts_[static_cast<size_t>(e)];
    }
    // Row where each expert's copies begin in the send order, advanced as copies are placed.
    std::vector<int32_t>& next_row = layout.recv_expert_counts_;  // scratch until the exchange
    int32_t running = 0;
    for (int64_t e = 0; e < E; ++e) {
        next_row[static_cast<size_t>(e)] = running;
        running += layout.send_expert_counts_[static_cast<size_t>(e)];
    }
    for (int64_t c = 0; c < num_copies; ++c)
        layout.copy_to_send_row_[static_cast<size_t>(c)] = next_row[topk_ids[c]]++;

    for (int p = 0; p < ep_size; ++p) {
        int rows = 0;
        for (int64_t le = 0; le < El; ++le) rows += layout.send_expert_counts_[p * El + le];
        layout.send_rows_per_rank_[p] = rows;
    }

    // Every rank learns how many rows each peer sends to each of its local experts.
    ep.all_to_all_v(layout.recv_expert_counts_.data(), layout.count_exchange_counts_,
                    layout.count_exchange_displs_, layout.send_expert_counts_.data(),
                    layout.count_exchange_counts_, layout.count_exchange_displs_);

    int64_t total = 0;
    for (int p = 0; p < ep_size; ++p) {
        int rows = 0;
        for (int64_t le = 0; le < El; ++le) rows += layout.recv_expert_counts_[p * El + le];
        layout.recv_rows_per_rank_[p] = rows;
        total += rows;
    }
    const int64_t capacity = cfg.capacity_rows(ep_size);
    MT_CHECK(total <= capacity,
             "[dispatch_layout] rank {} of group '{}' receives {} rows for its {} experts, but the "
             "dispatch buffer holds {} (recv_capacity_rows); raise it, up to the worst case {}",
             ep.rank(), ep.name(), total, El, capacity, cfg.worst_case_recv_rows(ep_size));
    layout.num_tokens_ = num_tokens;
    layout.num_recv_rows_ = total;

    // Segments of the expert-sorted rows: local expert major, then source rank.
    layout.expert_offsets_[0] = 0;
    for (int64_t le = 0; le < El; ++le) {
        int64_t rows = 0;
        for (int p = 0; p < ep_size; ++p) rows += layout.recv_expert_counts_[p * El + le];
        layout.expert_offsets_[le + 1] = layout.expert_offsets_[le] + rows;
    }
    // Staging (source rank major, then local expert) to expert-sorted rows.
    std::vector<int64_t>& expert_fill = layout.expert_fill_;
    std::copy(layout.expert_offsets_.begin(), layout.expert_offsets_.end() - 1,
              expert_fill.begin());
    int32_t staging_row = 0;
    for (int p = 0; p < ep_size; ++p) {
        for (int64_t le = 0; le < El; ++le) {
            const int32_t rows = layout.recv_expert_counts_[p * El + le];
            for (int32_t i = 0; i < rows; ++i)
                layout.staging_to_expert_row_[staging_row++] =
                    static_cast<int32_t>(expert_fill[le]++);
        }
    }

    exclusive_prefix_sum(std::span<int>(layout.send_displs_), layout.send_rows_per_rank_);
    exclusive_prefix_sum(std::span<int>(layout.recv_displs_), layout.recv_rows_per_rank_);
    const int D = static_cast<int>(cfg.hidden);
    for (int p = 0; p < ep_size; ++p) {
        layout.send_counts_[p] = layout.send_rows_per_rank_[p] * D;
        layout.send_displs_[p] *= D;
        layout.recv_counts_[p] = layout.recv_rows_per_rank_[p] * D;
        layout.recv_displs_[p] *= D;
    }
}

// The two movements every operation is made of. A friend of DispatchLayout.
class DispatchOps {
  public:
    // Token side -> expert side: gather token rows (scaled by the copy's weight when weights is
    // not null) into the send order, all_to_all_v, reorder the staging rows by local expert.
    static void to_experts(float* expert_rows, const float* token_rows, const float* weights,
                           const DispatchLayout& layout, DispatchBuffer& buffer, Communicator& ep) {
        const int64_t N = layout.num_tokens_, K = layout.config_.top_k;
        const int64_t D = layout.config_.hidden, R = layout.num_recv_rows_;
        float* send = buffer.send_rows();
        float* staging = buffer.staging_rows();
        const int32_t* copy_to_row = layout.copy_to_send_row_.data();
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < N; ++t) {
            const float* src = token_rows + t * D;
            for (int64_t j = 0; j < K; ++j) {
                const int64_t c = t * K + j;
                float* dst = send + copy_to_row[c] * D;
                if (weights == nullptr) {
                    std::memcpy(dst, src, static_cast<size_t>(D) * sizeof(float));
                } else {
                    const float w = weights[c];
                    for (int64_t i = 0; i < D; ++i) dst[i] = w * src[i];
                }
            }
        }
        ep.all_to_all_v(staging, layout.recv_counts_, layout.recv_displs_, send,
                        layout.send_counts_, layout.send_displs_);
        const int32_t* staging_to_expert = layout.staging_to_expert_row_.data();
#pragma omp parallel for schedule(static)
        for (int64_t s = 0; s < R; ++s)
            std::memcpy(expert_rows + staging_to_expert[s] * D, staging + s * D,
                        static_cast<size_t>(D) * sizeof(float));
    }

    // Expert side -> token side: reorder expert rows into staging, all_to_all_v back into
    // returned (send order), and sum each token's copies (weighted when weights is not null).
    static void to_tokens(float* token_rows, float* returned, const float* expert_rows,
                          const float* weights, const DispatchLayout& layout,
                          DispatchBuffer& buffer, Communicator& ep) {
        const int64_t N = layout.num_tokens_, K = layout.config_.top_k;
        const int64_t D = layout.config_.hidden, R = layout.num_recv_rows_;
        float* staging = buffer.staging_rows();
        const int32_t* staging_to_expert = layout.staging_to_expert_row_.data();
#pragma omp parallel for schedule(static)
        for (int64_t s = 0; s < R; ++s)
            std::memcpy(staging + s * D, expert_rows + staging_to_expert[s] * D,
                        static_cast<size_t>(D) * sizeof(float));
        ep.all_to_all_v(returned, layout.send_counts_, layout.send_displs_, staging,
                        layout.recv_counts_, layout.recv_displs_);
        const int32_t* copy_to_row = layout.copy_to_send_row_.data();
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < N; ++t) {
            float* dst = token_rows + t * D;
            std::fill(dst, dst + D, 0.0f);
            for (int64_t j = 0; j < K; ++j) {
                const int64_t c = t * K + j;
                const float* src = returned + copy_to_row[c] * D;
                const float w = weights == nullptr ? 1.0f : weights[c];
                for (int64_t i = 0; i < D; ++i) dst[i] += w * src[i];
            }
        }
    }

    // dweights[c] = dot(dout[t], returned[row of c]).
    static void weight_gradients(float* dweights, const float* dout, const float* returned,
                                 const DispatchLayout& layout) {
        const int64_t N = layout.num_tokens_, K = layout.config_.top_k;
        const int64_t D = layout.config_.hidden;
        const int32_t* copy_to_row = layout.copy_to_send_row_.data();
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < N; ++t) {
            for (int64_t j = 0; j < K; ++j) {
                const int64_t c = t * K + j;
                const float* y = returned + copy_to_row[c] * D;
                double dot = 0;  // double: D can be 7168 and the sum cancels
                for (int64_t i = 0; i < D; ++i) dot += static_cast<double>(dout[t * D + i]) * y[i];
                dweights[c] = static_cast<float>(dot);
            }
        }
    }

    static void check(const DispatchLayout& layout, const DispatchBuffer& buffer,
                      const Communicator& ep, const char* op) {
        check_group(layout.ep_size_, ep, op);
        check_buffer(layout.config_, layout.ep_size_, buffer, op);
    }
};

void dispatch_forward(float* expert_inp, const float* inp, const DispatchLayout& layout,
                      DispatchBuffer& buffer, Communicator& ep) {
    DispatchOps::check(layout, buffer, ep, "dispatch_forward");
    DispatchOps::to_experts(expert_inp, inp, nullptr, layout, buffer, ep);
}

void dispatch_backward(float* dinp, const float* dexpert_inp, const DispatchLayout& layout,
                       DispatchBuffer& buffer, Communicator& ep) {
    DispatchOps::check(layout, buffer, ep, "dispatch_backward");
    DispatchOps::to_tokens(dinp, buffer.send_rows(), dexpert_inp, nullptr, layout, buffer, ep);
}

void combine_forward(float* out, float* returned_rows, const float* expert_out,
                     const float* weights, const DispatchLayout& layout, DispatchBuffer& buffer,
                     Communicator& ep) {
    DispatchOps::check(layout, buffer, ep, "combine_forward");
    MT_CHECK(returned_rows != nullptr || layout.num_tokens() == 0,
             "[combine_forward] returned_rows is required (combine_backward reads it)");
    MT_CHECK(weights != nullptr || layout.num_tokens() == 0, "[combine_forward] weights is null");
    DispatchOps::to_tokens(out, returned_rows, expert_out, weights, layout, buffer, ep);
}

void combine_backward(float* dexpert_out, float* dweights, const float* dout, const float* weights,
                      const float* returned_rows, const DispatchLayout& layout,
                      DispatchBuffer& buffer, Communicator& ep) {
    DispatchOps::check(layout, buffer, ep, "combine_backward");
    MT_CHECK(weights != nullptr || layout.num_tokens() == 0, "[combine_backward] weights is null");
    if (dweights != nullptr) {
        MT_CHECK(returned_rows != nullptr || layout.num_tokens() == 0,
                 "[combine_backward] dweights needs the returned_rows saved by combine_forward");
        DispatchOps::weight_gradients(dweights, dout, returned_rows, layout);
    }
    DispatchOps::to_experts(dexpert_out, dout, weights, layout, buffer, ep);
}

}  // namespace moetron::parallel

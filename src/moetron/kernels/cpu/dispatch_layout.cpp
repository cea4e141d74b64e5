// The expert dispatch's routing metadata (dispatch_layout.h).
#include "moetron/kernels/cpu/dispatch_layout.h"

#include <algorithm>
#include <bit>

#include "moetron/core/error.h"

namespace moetron::cpu {

void dispatch_route_records(int32_t* records, const int32_t* topk_ids, const float* topk_weights,
                            int64_t num_tokens, int64_t top_k, int64_t num_experts,
                            int32_t source_rank) {
    const int64_t K = top_k, words = 2 * K + 1;
    for (int64_t t = 0; t < num_tokens; ++t) {
        int32_t* rec = records + t * words;
        rec[0] = source_rank;
        for (int64_t j = 0; j < K; ++j) {
            const int32_t e = topk_ids[t * K + j];
            MT_CHECK(e >= 0 && e < num_experts,
                     "[dispatch_layout] expert id {} of token {} (choice {}) is not in [0, {})", e,
                     t, j, num_experts);
            rec[1 + j] = e;
            rec[1 + K + j] = std::bit_cast<int32_t>(topk_weights[t * K + j]);
        }
    }
}

RoutingSpread dispatch_layout(int64_t* copies_per_rank, const int32_t* topk_ids, int64_t num_tokens,
                              int64_t top_k, int64_t experts_per_rank, int64_t ranks_per_domain,
                              int64_t num_ranks) {
    const int64_t K = top_k, El = experts_per_rank, L = ranks_per_domain;
    std::fill(copies_per_rank, copies_per_rank + num_ranks, 0);
    RoutingSpread spread;
    spread.num_tokens = num_tokens;
    for (int64_t t = 0; t < num_tokens; ++t) {
        int64_t ranks = 0, domains = 0;
        for (int64_t j = 0; j < K; ++j) {
            const int64_t rank = topk_ids[t * K + j] / El;
            ++copies_per_rank[rank];
            bool new_rank = true, new_domain = true;
            for (int64_t i = 0; i < j; ++i) {
                const int64_t other = topk_ids[t * K + i] / El;
                new_rank = new_rank && other != rank;
                new_domain = new_domain && other / L != rank / L;
            }
            ranks += new_rank;
            domains += new_domain;
        }
        spread.rank_sum += ranks;
        spread.rank_max = std::max(spread.rank_max, ranks);
        spread.domain_sum += domains;
        spread.domain_max = std::max(spread.domain_max, domains);
    }
    return spread;
}

int64_t dispatch_split_rounds(int64_t* ends, int64_t* copies_per_rank, const int32_t* topk_ids,
                              int64_t num_tokens, int64_t top_k, int64_t experts_per_rank,
                              int64_t num_ranks, int64_t max_copies_per_rank) {
    const int64_t K = top_k, El = experts_per_rank;
    std::fill(copies_per_rank, copies_per_rank + num_ranks, 0);
    int64_t count = 0;
    for (int64_t t = 0; t < num_tokens; ++t) {
        const int32_t* ids = topk_ids + t * K;
        bool fits = true;
        for (int64_t j = 0; j < K; ++j)
            fits = ++copies_per_rank[ids[j] / El] <= max_copies_per_rank && fits;
        if (fits) continue;
        // The token opens the next round (alone it fits).
        ends[count++] = t;
        std::fill(copies_per_rank, copies_per_rank + num_ranks, 0);
        for (int64_t j = 0; j < K; ++j) ++copies_per_rank[ids[j] / El];
    }
    ends[count++] = num_tokens;
    return count;
}

void dispatch_hop_layout(int32_t* slot_begin, int32_t* row_slots, int32_t* rows_per_peer,
                         int32_t* first_slot_of_peer, const int32_t* records, int64_t num_inputs,
                         int64_t top_k, int64_t first_expert, int64_t num_hop_experts,
                         int64_t experts_per_peer, int64_t num_peers) {
    const int64_t K = top_k, words = 2 * K + 1;
    auto peer_of = [&](int64_t e) {
        return e < first_expert || e >= first_expert + num_hop_experts
                   ? -1
                   : static_cast<int32_t>((e - first_expert) / experts_per_peer);
    };

    // The peers of each input row, ascending (insertion into the row's short list).
    std::fill(rows_per_peer, rows_per_peer + num_peers, 0);
    int32_t n = 0;
    for (int64_t i = 0; i < num_inputs; ++i) {
        slot_begin[i] = n;
        const int32_t* ids = records + i * words + 1;
        for (int64_t j = 0; j < K; ++j) {
            const int32_t p = peer_of(ids[j]);
            if (p < 0) continue;
            bool seen = false;
            for (int32_t s = slot_begin[i]; s < n; ++s) seen = seen || row_slots[s] == p;
            if (seen) continue;
            int32_t pos = n;
            while (pos > slot_begin[i] && row_slots[pos - 1] > p) {
                row_slots[pos] = row_slots[pos - 1];
                --pos;
            }
            row_slots[pos] = p;
            ++n;
            ++rows_per_peer[p];
        }
    }
    slot_begin[num_inputs] = n;

    // Send order: peer major, then input row. first_slot_of_peer serves as each peer's next free
    // slot, then is moved back to its first.
    int32_t running = 0;
    for (int64_t p = 0; p < num_peers; ++p) {
        first_slot_of_peer[p] = running;
        running += rows_per_peer[p];
    }
    for (int32_t s = 0; s < n; ++s) row_slots[s] = first_slot_of_peer[row_slots[s]]++;
    for (int64_t p = 0; p < num_peers; ++p) first_slot_of_peer[p] -= rows_per_peer[p];
}

int64_t dispatch_expert_layout(int64_t* expert_offsets, int32_t* copy_begin, int32_t* copy_row,
                               int32_t* copy_choice, float* copy_weight, int64_t* rows_by_source,
                               const int32_t* records, int64_t num_staging, int64_t top_k,
                               int64_t first_expert, int64_t num_local_experts, int64_t num_sources,
                               int64_t capacity) {
    const int64_t K = top_k, El = num_local_experts, words = 2 * K + 1;
    auto local_expert = [&](const int32_t* rec, int64_t j) { return rec[1 + j] - first_expert; };

    // Copies per (source rank, local expert).
    std::fill(rows_by_source, rows_by_source + num_sources * El, 0);
    int64_t total = 0;
    for (int64_t s = 0; s < num_staging; ++s) {
        const int32_t* rec = records + s * words;
        MT_CHECK(rec[0] >= 0 && rec[0] < num_sources,
                 "[dispatch_layout] a route record names source rank {} outside the EP group of {}",
                 rec[0], num_sources);
        for (int64_t j = 0; j < K; ++j) {
            const int64_t le = local_expert(rec, j);
            if (le < 0 || le >= El) continue;
            ++rows_by_source[rec[0] * El + le];
            ++total;
        }
    }
    if (total > capacity) return total;

    // Segments: local expert major, then source rank; rows_by_source becomes each block's next
    // free row.
    int64_t row = 0;
    for (int64_t le = 0; le < El; ++le) {
        expert_offsets[le] = row;
        for (int64_t p = 0; p < num_sources; ++p) {
            const int64_t n = rows_by_source[p * El + le];
            rows_by_source[p * El + le] = row;
            row += n;
        }
    }
    expert_offsets[El] = row;

    // Copies in staging order.
    int32_t c = 0;
    for (int64_t s = 0; s < num_staging; ++s) {
        copy_begin[s] = c;
        const int32_t* rec = records + s * words;
        for (int64_t j = 0; j < K; ++j) {
            const int64_t le = local_expert(rec, j);
            if (le < 0 || le >= El) continue;
            copy_row[c] = static_cast<int32_t>(rows_by_source[rec[0] * El + le]++);
            copy_choice[c] = static_cast<int32_t>(j);
            copy_weight[c] = std::bit_cast<float>(rec[1 + K + j]);
            ++c;
        }
    }
    copy_begin[num_staging] = c;
    return total;
}

}  // namespace moetron::cpu

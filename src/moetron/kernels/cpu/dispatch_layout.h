// The routing metadata of the expert dispatch (parallel/dispatch_stage.h): the per-token and
// per-row index work that a GPU runs as kernels before any row moves (DeepEP's
// get_dispatch_layout and its slot assignment). Serial scans where the order is the result (the
// slots of a peer follow the row order; the rounds are greedy in token order).
//
// A route record is 2K+1 int32 words: [0] the source rank in the EP group, [1, K] the token's K
// global expert ids, [K+1, 2K] its K weights (the float bits). Experts split contiguously over
// ranks (experts_per_rank each), ranks over domains (ranks_per_domain each).
#pragma once

#include <cstdint>

#include "moetron/kernels/op_types.h"

namespace moetron::cpu {

// records (N, 2K+1) from topk_ids and topk_weights (N, K). Expert ids must lie in [0, E).
void dispatch_route_records(int32_t* records, const int32_t* topk_ids, const float* topk_weights,
                            int64_t num_tokens, int64_t top_k, int64_t num_experts,
                            int32_t source_rank);

// DeepEP's get_dispatch_layout: copies_per_rank (num_ranks) = the token copies (N*K, a token with
// two experts on one rank counting twice) that go to each rank; returns how far the tokens spread
// (distinct destination ranks and domains per token).
RoutingSpread dispatch_layout(int64_t* copies_per_rank, const int32_t* topk_ids, int64_t num_tokens,
                              int64_t top_k, int64_t experts_per_rank, int64_t ranks_per_domain,
                              int64_t num_ranks);

// Splits the tokens into rounds that each send at most max_copies_per_rank copies to every rank,
// greedily in token order (a token alone must fit: max_copies_per_rank >= min(K, experts per
// rank)): round i is tokens [ends[i-1], ends[i]) (ends[-1] = 0). Returns the number of rounds (1
// for no tokens); ends holds max(1, N); copies_per_rank (num_ranks) is scratch.
int64_t dispatch_split_rounds(int64_t* ends, int64_t* copies_per_rank, const int32_t* topk_ids,
                              int64_t num_tokens, int64_t top_k, int64_t experts_per_rank,
                              int64_t num_ranks, int64_t max_copies_per_rank);

// One hop's send layout, from its input rows' records. A row's peers are the owners of its
// experts within [first_expert, first_expert + num_hop_experts), experts_per_peer each: once per
// peer however many experts it holds there, ascending. rows_per_peer (num_peers) counts the rows
// sent to each peer, first_slot_of_peer (num_peers) is its exclusive scan, and the send slot of
// each (row, peer) pair, peer major then row order, is row_slots[slot_begin[i] + n] for row i's
// n-th peer (slot_begin: num_inputs + 1; row_slots: the total, slot_begin[num_inputs]).
void dispatch_hop_layout(int32_t* slot_begin, int32_t* row_slots, int32_t* rows_per_peer,
                         int32_t* first_slot_of_peer, const int32_t* records, int64_t num_inputs,
                         int64_t top_k, int64_t first_expert, int64_t num_hop_experts,
                         int64_t experts_per_peer, int64_t num_peers);

// The expert side of the last hop's receiver, from its staging rows' records: each staging row's
// copies on the local experts [first_expert, + num_local_experts), their expert rows sorted by
// local expert, inside an expert by source rank (num_sources), then by staging order (which keeps
// each source's token order). Writes expert_offsets (El + 1), copy_begin (num_staging + 1), and
// per copy copy_row, copy_choice (j) and copy_weight; rows_by_source (num_sources * El) is
// scratch. Returns the number of copies R; when R > capacity it writes nothing else (the caller
// reports it). Source ranks must lie in [0, num_sources).
int64_t dispatch_expert_layout(int64_t* expert_offsets, int32_t* copy_begin, int32_t* copy_row,
                               int32_t* copy_choice, float* copy_weight, int64_t* rows_by_source,
                               const int32_t* records, int64_t num_staging, int64_t top_k,
                               int64_t first_expert, int64_t num_local_experts, int64_t num_sources,
                               int64_t capacity);

}  // namespace moetron::cpu

// The pieces that the flat and the two-tier expert dispatch (dispatch_flat.h,
// dispatch_two_tier.h) are both made of. A dispatch is a chain of hops, then the expert side:
//
//   token rows --hop--> ... --hop--> staging rows --expand--> expert rows (sorted by local expert)
//
// A hop is one all_to_all_v over one group: every input row travels once to each peer that owns
// at least one of its experts (DeepEP's "once per destination", not once per copy), and on the
// way back the rows those peers return are summed into it. Flat: one hop over the EP group, the
// peer being the rank that owns the expert. Two-tier: a hop over the rail (the peer being the
// domain that owns the expert, reached at the rank with this rank's local index), then a hop
// inside the domain (the peer being the owning rank, among this domain's experts). A row whose
// peer is this rank itself skips the all_to_all_v: it is copied straight to the receive side.
// At the last hop's receiver each staging row expands to its copies on this rank's experts, and
// combine sums the copies' weighted outputs into one row per staging row before going back.
//
// Routing travels with the rows at layout time as route records of 2K+1 int32 words:
//   [0] the source rank in the EP group, [1, K] the token's K global expert ids,
//   [K+1, 2K] its K weights (the float bits).
// A row's peers at every hop follow from its ids, so no other metadata (masks) travels.
// The token rows of a dispatch may travel packed in a low-precision format
// (DispatchConfig::token_format, dispatch_payload.h): encoded once before the first hop, passed
// on as bytes by every hop (also by two_tier's forwarding rank), decoded once at the last hop's
// receiver into the staging rows that expand to the expert rows.
// Gradient rule (kernels/README.md): every output here is written, none accumulated.
//
// What moves or combines rows, and what computes the routing metadata per token or row, is a
// dispatch op of the Backend (kernels/backend.h, kernels/cpu/dispatch_rows.h and
// dispatch_layout.h); this file plans, keeps the index arrays and drives the collectives, which
// take the backend's stream() for the rows and records and kHostStream for the row counts.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/kernels/backend.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/dispatch_payload.h"
#include "moetron/parallel/dispatch_traffic.h"

namespace moetron::parallel {

struct DispatchConfig {
    int64_t num_experts = 0;  // E, over the whole EP group
    int64_t top_k = 0;        // K
    int64_t hidden = 0;       // D
    int64_t max_tokens = 0;   // N per rank and call, at most
    // Rows one rank sends to one EP rank's experts in one routing, at most (copies: a token with
    // two experts there counts twice): the unit every receive buffer is planned in. A rank holds
    // ep of them on the expert side, and a hop receives at most min(max_tokens, this) rows from
    // each source. 0: the worst case, max_tokens * min(K, El), which any routing fits. A smaller
    // budget saves memory; the caller splits a routing that exceeds it into rounds
    // (ExpertDispatcher::plan_rounds), and Route::plan refuses one that does not fit, on the
    // sending rank and before any collective.
    int64_t pair_capacity_rows = 0;
    // Consecutive EP ranks per scale-up domain (0: the whole EP group is one domain). The flat
    // dispatch uses it only to tell intra- from inter-domain bytes; the two-tier one routes by it.
    int64_t domain_size = 0;
    // The format the buffers are planned for the token rows to travel to the experts in
    // (dispatch_payload.h): the recipe's row-wise quantized copy, decoded on arrival into the
    // expert rows. Each dispatch names its format: this one, or float32. Everything else
    // (combine, the gradients, the route records) travels as float32 or int32.
    Precision token_format = Precision::fp32;
    // Throws unless a dispatch may send its tokens in `format` through buffers planned by this.
    void check_token_format(Precision format) const;

    // Throws moetron::Error saying which value cannot work with an EP group of ep_size ranks.
    void validate(int ep_size) const;
    int64_t local_experts(int ep_size) const { return num_experts / ep_size; }
    int64_t worst_case_recv_rows(int ep_size) const;  // ep * the worst pair rows
    // pair_capacity_rows, or the worst case max_tokens * min(K, El) (also when larger).
    int64_t pair_rows(int ep_size) const;
    int64_t capacity_rows(int ep_size) const { return ep_size * pair_rows(ep_size); }  // R at most
    // Rows a hop receives from one source at most: each source token once, within the budget.
    int64_t recv_rows_per_source(int ep_size) const;
    // Whether a routing can exceed the budget (then the caller plans rounds).
    bool can_overflow(int ep_size) const;
    // EP ranks per domain (L) and EP domains (G = ep / L).
    int64_t ranks_per_domain(int ep_size) const;
    int64_t num_domains(int ep_size) const { return ep_size / ranks_per_domain(ep_size); }
    int64_t record_words() const { return 2 * top_k + 1; }
    int64_t token_row_bytes() const { return payload_row_bytes(token_format, hidden); }
};

// Splits num_tokens tokens (topk_ids (N, K), global expert ids) into rounds that each send at most
// config.pair_rows rows to every EP rank, greedily in token order (a token alone always fits):
// round i is tokens [ends[i-1], ends[i]) (ends[-1] = 0). Returns the number of rounds (1 for no
// tokens). ends holds max(1, N) at least; rows_to_rank (ep_size) is scratch.
int64_t split_into_rounds(std::span<int64_t> ends, std::span<int64_t> rows_to_rank,
                          const int32_t* topk_ids, int64_t num_tokens, const DispatchConfig& config,
                          int ep_size, Backend& backend);

// Bytes a rank sent to other ranks (its own rows excluded), split by tier: to ranks of its own
// scale-up domain, and to ranks of other domains. Everything the dispatch sends counts: rows,
// route records, counts and weight gradients.
struct DispatchBytes {
    uint64_t intra_domain = 0;
    uint64_t inter_domain = 0;
};

// How far one layout's tokens spread: destination ranks and domains per token (op_types.h, as
// the dispatch_layout op computes it).
using RoutingSpread = moetron::RoutingSpread;

// Which peer of a hop owns global expert e: experts [first, first + count) split contiguously,
// per_peer each. An expert outside the range (-1) is not this hop's business.
struct ExpertsToPeers {
    int64_t first = 0;
    int64_t count = 0;
    int64_t per_peer = 1;
    int peer_of(int64_t e) const {
        return e < first || e >= first + count ? -1 : static_cast<int>((e - first) / per_peer);
    }
};

// What a hop is, fixed at construction from the config and this rank's place.
struct HopSpec {
    std::string name;  // "ep", "rail", "domain": for error messages
    int group_size = 1;
    int self = 0;
    std::vector<uint8_t> peer_is_remote;  // (group_size) 1: that peer is in another domain
    ExpertsToPeers to_peers;
    int64_t max_inputs = 0;  // input rows
    int64_t max_slots = 0;   // (input row, peer) pairs
    int64_t max_recv = 0;    // rows received
};

// The rows a hop sends and receives: its communication buffers (shared by all layouts).
struct HopBuffers {
    float* send = nullptr;            // (max_slots, max(D, K))
    float* recv = nullptr;            // (max_recv, max(D, K))
    int32_t* send_records = nullptr;  // (max_slots, 2K+1)
    int32_t* recv_records = nullptr;  // (max_recv, 2K+1)
};

// What an exchange carries per row: hidden rows (D floats), weight gradients (K floats), route
// records (2K+1 words) or token rows in the dispatch's wire format (token_row_bytes bytes).
enum class Payload { rows, weights, records, packed_rows };

class Hop {
  public:
    Hop(HopSpec spec, int64_t hidden, int64_t top_k, int64_t packed_row_bytes, Backend& backend);

    const HopSpec& spec() const { return spec_; }
    int64_t num_inputs() const { return num_inputs_; }
    int64_t num_recv() const { return num_recv_; }
    std::span<const int> send_rows_per_peer() const { return send_rows_; }
    std::span<const int> recv_rows_per_peer() const { return recv_rows_; }

    // Layout: the peers of each input row from its record, the counts exchanged, the records
    // sent (recv_records gets the received ones). Collective over group.
    void plan(const int32_t* records, int64_t num_inputs, const HopBuffers& buffers,
              Communicator& group, DispatchBytes& bytes);
    // Forward: each input row (the payload's width) to each of its peers; recv gets what arrives
    // once the returned exchange completes (send and recv stay untouched until then).
    CollectiveHandle fan_out(void* recv, void* send, const void* input, Payload payload,
                             Communicator& group, DispatchBytes& bytes) const;
    // Reverse, in two parts: fan_in_post sends recv's rows back to where they came from (they
    // arrive in send); once that completes, fan_in_sum makes input[i] = the sum over the peers of
    // row i of what they returned, written, or added to input[i] when accumulate (the sum is
    // formed first, so adding gives exactly input[i] + the written value).
    CollectiveHandle fan_in_post(float* send, const float* recv, Payload payload,
                                 Communicator& group, DispatchBytes& bytes) const;
    void fan_in_sum(float* input, const float* send, const float* recv, Payload payload,
                    bool accumulate) const;

  private:
    struct PeerCounts {  // in elements (bytes for packed rows), own rows zeroed (they bypass MPI)
        std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
    };
    int64_t width(Payload p) const;  // elements per row
    static DType element_type(Payload p) {
        return p == Payload::packed_rows ? DType::u8 : DType::f32;
    }
    // Where this rank's own slots live (they bypass the exchange: straight into recv).
    SlotPlacement own_slots() const;
    void check_group(const Communicator& group, const char* op) const;
    void count_sent(std::span<const int> counts, DType element, DispatchBytes& bytes) const;

    HopSpec spec_;
    int64_t hidden_, top_k_, packed_row_bytes_;
    Backend* backend_;
    int64_t num_inputs_ = 0, num_recv_ = 0;
    std::vector<int32_t> input_slot_begin_;  // (max_inputs + 1) CSR over input rows
    std::vector<int32_t> input_slots_;       // (max_slots) send slot of each (row, peer)
    std::vector<int> send_rows_, send_displs_, recv_rows_, recv_displs_;  // (group) in rows
    std::vector<int> one_per_peer_, peer_index_;  // for exchanging one count with every peer
    PeerCounts counts_[4];                        // by Payload
};

// The last hop's receiver: each staging row's copies on this rank's experts, the expert rows
// sorted by local expert, inside an expert by source rank, then by the source's token order.
class ExpertSide {
  public:
    ExpertSide(const DispatchConfig& config, int ep_size, int ep_rank, Backend& backend);

    int64_t num_rows() const { return num_rows_; }  // R
    std::span<const int64_t> expert_offsets() const { return expert_offsets_; }
    int64_t local_experts() const { return local_experts_; }
    int64_t first_expert() const { return first_expert_; }

    // From the staging rows' route records; throws when R exceeds the capacity (only this rank
    // can know: call it after the layout's last collective).
    void build(const int32_t* records, int64_t num_staging, const std::string& group_name);
    // expert_rows[copy] = (weight of the copy, when weighted) * staging[row of the copy].
    void expand(float* expert_rows, const float* staging, bool weighted) const;
    // staging[row] = sum over the row's copies of (weight, when weighted) * expert_rows[copy].
    void reduce(float* staging, const float* expert_rows, bool weighted) const;
    // dweights (num_staging, K): for the row's copy of choice j, dot(dout[row], expert_out[copy]);
    // 0 for choices on other ranks (summed on the way back, the zeros add nothing).
    void weight_grads(float* dweights, const float* dout, const float* expert_out) const;

  private:
    DispatchConfig config_;
    int ep_size_;
    int ep_rank_;
    Backend* backend_;
    int64_t local_experts_, first_expert_, capacity_;
    int64_t num_staging_ = 0, num_rows_ = 0;
    std::vector<int32_t> staging_copy_begin_;  // (max staging + 1) CSR over staging rows
    std::vector<int32_t> copy_expert_row_;     // (capacity) expert row of each copy
    std::vector<int32_t> copy_choice_;         // (capacity) j of each copy
    std::vector<float> copy_weight_;           // (capacity)
    std::vector<int64_t> expert_offsets_;      // (El + 1)
    std::vector<int64_t> rows_by_source_;      // (ep, El) scratch: counts, then fill positions
};

// The communication buffers of a chain of hops, planned up front and shared by every MoE layer
// of a rank (their contents live only during one movement); and the bytes sent through them. One
// movement at a time may be in flight through a buffer: routings in flight at once (the dual
// micro-batch overlap) each need their own.
class RouteBuffer {
  public:
    // The buffers come from backend.memory().
    RouteBuffer(const DispatchConfig& config, int ep_size, std::span<const HopSpec> hops,
                Backend& backend);
    // The sizes, before allocating anything: per hop "<name>.send_rows", "<name>.recv_rows",
    // "<name>.send_records", "<name>.recv_records"; "token_records" (max_tokens, 2K+1) and
    // "staging_weights" (last hop's max_recv, K); with a quantized token payload also
    // "token_packed" and "staging_decoded".
    static ArenaPlan plan(const DispatchConfig& config, std::span<const HopSpec> hops);

    const DispatchConfig& config() const { return config_; }
    int ep_size() const { return ep_size_; }
    Backend& backend() const { return *backend_; }
    size_t size_bytes() const { return arena_.size_bytes(); }
    const HopBuffers& hop(size_t i) const { return hops_[i]; }
    size_t num_hops() const { return hops_.size(); }
    int32_t* token_records() const { return token_records_; }
    float* staging_weights() const { return staging_weights_; }
    // A quantized token payload only (else null): the token rows encoded for the first hop
    // (max_tokens, token_row_bytes), and the staging rows decoded (last hop's max_recv, D).
    uint8_t* token_packed() const { return token_packed_; }
    float* staging_decoded() const { return staging_decoded_; }
    TokenRowCodec& codec() { return codec_; }
    DispatchBytes& bytes_sent() { return bytes_sent_; }
    const DispatchBytes& bytes_sent() const { return bytes_sent_; }
    // The movement in flight through this buffer (null: none); RouteTransfer sets and clears it.
    const void* in_flight = nullptr;

  private:
    DispatchConfig config_;
    int ep_size_;
    Backend* backend_;
    Arena arena_;
    std::vector<HopBuffers> hops_;
    int32_t* token_records_;
    float* staging_weights_;
    uint8_t* token_packed_ = nullptr;
    float* staging_decoded_ = nullptr;
    TokenRowCodec codec_;
    DispatchBytes bytes_sent_;
};

// One data movement of a Route in flight: which one, the collective posted last (its handle) and
// what the remaining steps read and write. A movement is a chain of collectives, one per hop (two
// chains for combine_grads), each preceded by a local gather and followed by a local scatter;
// Route::advance waits for the posted collective, does the local work after it and posts the next.
// Posting happens only inside begin_* and advance, at points of the program every rank reaches in
// the same order, so collectives on one group always match across ranks. Destroying a transfer
// in flight waits for its collective (CollectiveHandle) but leaves the movement unfinished.
class RouteTransfer {
  public:
    RouteTransfer() = default;
    RouteTransfer(const RouteTransfer&) = delete;
    RouteTransfer& operator=(const RouteTransfer&) = delete;
    ~RouteTransfer();
    bool in_flight() const { return movement_ != Movement::none; }
    int num_steps(size_t num_hops) const {  // collectives of the movement in flight
        return static_cast<int>(movement_ == Movement::combine_grads ? 2 * num_hops : num_hops);
    }

  private:
    friend class Route;
    enum class Movement { none, to_experts, to_tokens, combine_grads };
    Movement movement_ = Movement::none;
    int step_ = 0;  // the collective in flight, counted from 0
    RouteBuffer* buffer_ = nullptr;
    std::span<Communicator* const> groups_;
    float* out_ = nullptr;               // expert rows (to_experts, combine_grads) or token rows
    const float* in_ = nullptr;          // token rows (to_experts, combine_grads) or expert rows
    float* dweights_ = nullptr;          // combine_grads
    const float* expert_out_ = nullptr;  // combine_grads
    bool weighted_ = false, accumulate_ = false;
    Payload forward_payload_ = Payload::rows;  // what the forward chain's hops carry
    CollectiveHandle handle_;
};

// A routing through a chain of hops: the hops' plans, the expert side and the spread. The
// operations take the groups hop by hop (groups[i] is hops[i]'s) and the shared buffer. Each data
// movement is a begin_* (the local gather, the first collective posted) and finish (the rest);
// the blocking forms are both at once.
class Route {
  public:
    // Its ops run on backend, which the buffers given to it must come from too.
    Route(const DispatchConfig& config, int ep_size, int ep_rank, std::vector<HopSpec> hops,
          Backend& backend);

    const DispatchConfig& config() const { return config_; }
    int ep_size() const { return ep_size_; }
    int64_t num_tokens() const { return num_tokens_; }
    const ExpertSide& experts() const { return experts_; }
    const Hop& hop(size_t i) const { return hops_[i]; }
    const RoutingSpread& spread() const { return spread_; }

    // topk_ids, topk_weights (N, K) -> every hop planned, the expert side built.
    void plan(const int32_t* topk_ids, const float* topk_weights, int64_t num_tokens,
              RouteBuffer& buffer, std::span<Communicator* const> groups);
    // Token rows (N, D) -> expert rows (R, D), scaled by each copy's weight when weighted; the
    // rows travel in token_format (DispatchConfig::check_token_format).
    void to_experts(float* expert_rows, const float* token_rows, bool weighted,
                    Precision token_format, RouteBuffer& buffer,
                    std::span<Communicator* const> groups) const;
    // Expert rows (R, D) -> token rows (N, D): each token's copies summed (weighted when asked).
    void to_tokens(float* token_rows, const float* expert_rows, bool weighted, RouteBuffer& buffer,
                   std::span<Communicator* const> groups) const;
    // combine's backward: dexpert_out = w * dout at the experts; dweights (N, K) =
    // dot(dout[t], expert_out[copy]) computed at the experts and sent back (so dweights may be
    // null only on a rank without tokens: the return is a collective every rank joins).
    void combine_grads(float* dexpert_out, float* dweights, const float* dout,
                       const float* expert_out, RouteBuffer& buffer,
                       std::span<Communicator* const> groups) const;
    // The same movements, begun: the collectives run while the caller computes, until finish()
    // (or advance() one hop at a time). The buffer, the groups (the span's storage) and the
    // pointers given must stay alive and untouched until then; the buffer must have no other
    // movement in flight. to_tokens adds to token_rows instead of writing them when accumulate.
    void begin_to_experts(RouteTransfer& t, float* expert_rows, const float* token_rows,
                          bool weighted, Precision token_format, RouteBuffer& buffer,
                          std::span<Communicator* const> groups) const;
    void begin_to_tokens(RouteTransfer& t, float* token_rows, const float* expert_rows,
                         bool weighted, bool accumulate, RouteBuffer& buffer,
                         std::span<Communicator* const> groups) const;
    void begin_combine_grads(RouteTransfer& t, float* dexpert_out, float* dweights,
                             const float* dout, const float* expert_out, RouteBuffer& buffer,
                             std::span<Communicator* const> groups) const;
    // Waits for the posted collective, does the local work after it, posts the next (if any).
    void advance(RouteTransfer& t) const;
    // Advances until the movement is complete (nothing when none is in flight).
    void finish(RouteTransfer& t) const;
    // Advances when the collective in flight is not the movement's last (two_tier's first hop of
    // a combine: its second, the slow rail, then flies while the caller computes); else nothing,
    // so that a one-hop movement keeps flying.
    void post_next(RouteTransfer& t) const;

    // Throws when the buffer or the groups do not fit this route.
    void check(const RouteBuffer& buffer, std::span<Communicator* const> groups,
               const char* op) const;

  private:
    // Throws when the tokens send more rows to one EP rank than the budget (pair_rows), from the
    // copies per rank that dispatch_layout counted.
    void check_pair_budget() const;
    float* staging(const RouteBuffer& buffer) const { return buffer.hop(hops_.size() - 1).recv; }
    void start(RouteTransfer& t, RouteTransfer::Movement movement, RouteBuffer& buffer,
               std::span<Communicator* const> groups, const char* op) const;
    // Step k of a forward chain (hop k): post; and of a return chain (hop H-1-k, from the staging
    // rows last_recv back to token_out): post, then the sum once it arrived.
    void post_forward(RouteTransfer& t, size_t k, const void* token_rows) const;
    void post_return(RouteTransfer& t, size_t k, const float* last_recv, Payload payload) const;
    void sum_return(const RouteTransfer& t, size_t k, float* token_out, const float* last_recv,
                    Payload payload, bool accumulate) const;

    DispatchConfig config_;
    int ep_size_, ep_rank_;
    Backend* backend_;
    std::vector<Hop> hops_;
    ExpertSide experts_;
    int64_t num_tokens_ = 0;
    RoutingSpread spread_;
    std::vector<int64_t> rows_to_rank_;  // (ep) copies per EP rank of the last plan
};

}  // namespace moetron::parallel

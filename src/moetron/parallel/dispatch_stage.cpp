#include "moetron/parallel/dispatch_stage.h"

#include <algorithm>
#include <climits>

#include "moetron/core/error.h"

namespace moetron::parallel {

namespace {

void exclusive_prefix_sum(std::span<int> offsets, std::span<const int> counts) {
    int running = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
        offsets[i] = running;
        running += counts[i];
    }
}

// Floats per row of the hop buffers: a hidden row, K weight gradients, or a packed token row.
int64_t row_width(const DispatchConfig& c) {
    const int64_t packed_floats = (c.token_row_bytes() + 3) / 4;
    return std::max({c.hidden, c.top_k, packed_floats});
}

}  // namespace

// ---- DispatchConfig ----

void DispatchConfig::check_token_format(Precision format) const {
    MT_CHECK(format == Precision::fp32 || format == token_format,
             "[dispatch] tokens sent in {}, but the buffers are planned for {} (or float32)",
             precision_name(format), precision_name(token_format));
}

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
    MT_CHECK(pair_capacity_rows >= 0, "[dispatch] pair_capacity_rows must be >= 0, got {}",
             pair_capacity_rows);
    MT_CHECK(domain_size >= 0, "[dispatch] domain_size must be >= 0 (0: one domain), got {}",
             domain_size);
    MT_CHECK(domain_size == 0 || domain_size >= ep_size || ep_size % domain_size == 0,
             "[dispatch] an EP group of {} ranks does not split into whole domains of {} ranks; "
             "use an ep that is a multiple of domain_size (or at most domain_size)",
             ep_size, domain_size);
    // all_to_all_v counts and displacements are MPI ints, in floats. The staging rows hold every
    // source token once at worst (ep * max_tokens rows).
    MT_CHECK(max_tokens * top_k * row_width(*this) <= INT_MAX,
             "[dispatch] max_tokens*K*D = {}*{}*{} floats exceed MPI's int count limit; use "
             "smaller micro-batches",
             max_tokens, top_k, hidden);
    MT_CHECK(ep_size * max_tokens * row_width(*this) <= INT_MAX,
             "[dispatch] ep*max_tokens*D = {}*{}*{} staging floats exceed MPI's int count limit; "
             "use smaller micro-batches",
             ep_size, max_tokens, hidden);
    // Packed token rows are counted in bytes (the same bounds as the floats above).
    MT_CHECK(token_format == Precision::fp32 ||
                 std::max<int64_t>(top_k, ep_size) * max_tokens * token_row_bytes() <= INT_MAX,
             "[dispatch] max(K, ep)*max_tokens*row_bytes = {}*{}*{} payload bytes exceed MPI's "
             "int count limit; use smaller micro-batches",
             std::max<int64_t>(top_k, ep_size), max_tokens, token_row_bytes());
    // The expert rows stay on this rank (no MPI count), indexed by int32.
    MT_CHECK(capacity_rows(ep_size) <= INT_MAX,
             "[dispatch] {} expert-side rows exceed the int32 row index; set a smaller MoE "
             "capacity factor (the worst case is {} rows)",
             capacity_rows(ep_size), worst_case_recv_rows(ep_size));
}

int64_t DispatchConfig::worst_case_recv_rows(int ep_size) const {
    return ep_size * max_tokens * std::min(top_k, local_experts(ep_size));
}

int64_t DispatchConfig::pair_rows(int ep_size) const {
    const int64_t worst = max_tokens * std::min(top_k, local_experts(ep_size));
    return pair_capacity_rows > 0 ? std::min(pair_capacity_rows, worst) : worst;
}

int64_t DispatchConfig::recv_rows_per_source(int ep_size) const {
    return std::min(max_tokens, pair_rows(ep_size));
}

bool DispatchConfig::can_overflow(int ep_size) const {
    return pair_rows(ep_size) < max_tokens * std::min(top_k, local_experts(ep_size));
}

int64_t DispatchConfig::ranks_per_domain(int ep_size) const {
    return domain_size == 0 ? ep_size : std::min<int64_t>(domain_size, ep_size);
}

int64_t split_into_rounds(std::span<int64_t> ends, std::span<int64_t> rows_to_rank,
                          const int32_t* topk_ids, int64_t num_tokens, const DispatchConfig& config,
                          int ep_size, Backend& backend) {
    MT_CHECK(static_cast<int64_t>(ends.size()) >= std::max<int64_t>(1, num_tokens) &&
                 static_cast<int64_t>(rows_to_rank.size()) == ep_size,
             "[dispatch] split_into_rounds: {} ends and {} counters for {} tokens and {} ranks",
             ends.size(), rows_to_rank.size(), num_tokens, ep_size);
    // A token alone fits: pair_rows >= min(K, El).
    return backend.dispatch_split_rounds(ends.data(), rows_to_rank.data(), topk_ids, num_tokens,
                                         config.top_k, config.local_experts(ep_size), ep_size,
                                         config.pair_rows(ep_size));
}

// ---- Hop ----

Hop::Hop(HopSpec spec, int64_t hidden, int64_t top_k, int64_t packed_row_bytes, Backend& backend)
    : spec_(std::move(spec)),
      hidden_(hidden),
      top_k_(top_k),
      packed_row_bytes_(packed_row_bytes),
      backend_(&backend) {
    const auto g = static_cast<size_t>(spec_.group_size);
    MT_CHECK(spec_.peer_is_remote.size() == g && spec_.self >= 0 && spec_.self < spec_.group_size,
             "[dispatch] hop '{}': bad spec (group {}, self {})", spec_.name, spec_.group_size,
             spec_.self);
    input_slot_begin_.resize(static_cast<size_t>(spec_.max_inputs) + 1);
    input_slots_.resize(static_cast<size_t>(spec_.max_slots));
    for (auto* v :
         {&send_rows_, &send_displs_, &recv_rows_, &recv_displs_, &one_per_peer_, &peer_index_})
        v->resize(g);
    for (PeerCounts& c : counts_)
        for (auto* v : {&c.send_counts, &c.send_displs, &c.recv_counts, &c.recv_displs})
            v->resize(g);
    for (size_t p = 0; p < g; ++p) {
        one_per_peer_[p] = 1;
        peer_index_[p] = static_cast<int>(p);
    }
}

int64_t Hop::width(Payload p) const {
    switch (p) {
        case Payload::rows:
            return hidden_;
        case Payload::weights:
            return top_k_;
        case Payload::records:
            return 2 * top_k_ + 1;
        case Payload::packed_rows:
            return packed_row_bytes_;
    }
    return 0;
}

void Hop::check_group(const Communicator& group, const char* op) const {
    MT_CHECK(group.size() == spec_.group_size && group.rank() == spec_.self,
             "[{}] hop '{}' was planned for rank {} of a group of {}, group '{}' gives rank {} of "
             "{}",
             op, spec_.name, spec_.self, spec_.group_size, group.name(), group.rank(),
             group.size());
}

void Hop::count_sent(std::span<const int> counts, DType element, DispatchBytes& bytes) const {
    for (int p = 0; p < spec_.group_size; ++p) {
        if (p == spec_.self) continue;
        const uint64_t b = static_cast<uint64_t>(counts[p]) * dtype_size_bytes(element);
        (spec_.peer_is_remote[p] ? bytes.inter_domain : bytes.intra_domain) += b;
    }
}

void Hop::plan(const int32_t* records, int64_t num_inputs, const HopBuffers& buffers,
               Communicator& group, DispatchBytes& bytes) {
    check_group(group, "dispatch_layout");
    MT_CHECK(num_inputs >= 0 && num_inputs <= spec_.max_inputs,
             "[dispatch_layout] hop '{}': {} input rows, but it holds at most {}", spec_.name,
             num_inputs, spec_.max_inputs);
    const int64_t K = top_k_, words = 2 * K + 1;
    const int g = spec_.group_size;

    // The peers of each input row, the rows per peer, and each (row, peer) pair's send slot:
    // peer major, then input row.
    backend_->dispatch_hop_layout(input_slot_begin_.data(), input_slots_.data(), send_rows_.data(),
                                  send_displs_.data(), records, num_inputs, K, spec_.to_peers.first,
                                  spec_.to_peers.count, spec_.to_peers.per_peer, g);
    num_inputs_ = num_inputs;

    // Every peer learns how many rows it receives from this rank.
    group.all_to_all_v(recv_rows_.data(), one_per_peer_, peer_index_, send_rows_.data(),
                       one_per_peer_, peer_index_, kHostStream);
    count_sent(one_per_peer_, DType::i32, bytes);
    exclusive_prefix_sum(recv_displs_, recv_rows_);
    num_recv_ = recv_displs_[g - 1] + recv_rows_[g - 1];
    // Cannot fail: Route::plan checked every source's rows against the pair budget, which
    // max_recv is planned from.
    MT_CHECK(num_recv_ <= spec_.max_recv,
             "[dispatch_layout] hop '{}': rank {} receives {} rows, more than the {} planned",
             spec_.name, spec_.self, num_recv_, spec_.max_recv);

    for (Payload payload :
         {Payload::rows, Payload::weights, Payload::records, Payload::packed_rows}) {
        PeerCounts& c = counts_[static_cast<int>(payload)];
        const int w = static_cast<int>(width(payload));
        for (int p = 0; p < g; ++p) {
            const bool own = p == spec_.self;  // own rows bypass MPI
            c.send_counts[p] = own ? 0 : send_rows_[p] * w;
            c.send_displs[p] = send_displs_[p] * w;
            c.recv_counts[p] = own ? 0 : recv_rows_[p] * w;
            c.recv_displs[p] = recv_displs_[p] * w;
        }
    }

    // The records follow the rows' own path.
    const PeerCounts& c = counts_[static_cast<int>(Payload::records)];
    backend_->dispatch_fan_out(buffers.send_records, buffers.recv_records, records,
                               input_slot_begin_.data(), input_slots_.data(), num_inputs,
                               words * static_cast<int64_t>(sizeof(int32_t)), own_slots());
    group.all_to_all_v(buffers.recv_records, c.recv_counts, c.recv_displs, buffers.send_records,
                       c.send_counts, c.send_displs, backend_->stream());
    count_sent(c.send_counts, DType::i32, bytes);
}

SlotPlacement Hop::own_slots() const {
    return {send_displs_[spec_.self], send_rows_[spec_.self], recv_displs_[spec_.self]};
}

CollectiveHandle Hop::fan_out(void* recv, void* send, const void* input, Payload payload,
                              Communicator& group, DispatchBytes& bytes) const {
    check_group(group, "dispatch");
    const DType element = element_type(payload);
    const auto row_bytes = width(payload) * static_cast<int64_t>(dtype_size_bytes(element));
    backend_->dispatch_fan_out(send, recv, input, input_slot_begin_.data(), input_slots_.data(),
                               num_inputs_, row_bytes, own_slots());
    const PeerCounts& c = counts_[static_cast<int>(payload)];
    count_sent(c.send_counts, element, bytes);
    return group.all_to_all_v_async(recv, c.recv_counts, c.recv_displs, send, c.send_counts,
                                    c.send_displs, element, backend_->stream());
}

CollectiveHandle Hop::fan_in_post(float* send, const float* recv, Payload payload,
                                  Communicator& group, DispatchBytes& bytes) const {
    check_group(group, "combine");
    MT_CHECK(payload != Payload::packed_rows, "[combine] packed rows travel to the experts only");
    const PeerCounts& c = counts_[static_cast<int>(payload)];
    count_sent(c.recv_counts, DType::f32, bytes);
    return group.all_to_all_v_async(send, c.send_counts, c.send_displs, recv, c.recv_counts,
                                    c.recv_displs, DType::f32, backend_->stream());
}

void Hop::fan_in_sum(float* input, const float* send, const float* recv, Payload payload,
                     bool accumulate) const {
    backend_->dispatch_fan_in(input, send, recv, input_slot_begin_.data(), input_slots_.data(),
                              num_inputs_, width(payload), own_slots(), accumulate);
}

// ---- ExpertSide ----

ExpertSide::ExpertSide(const DispatchConfig& config, int ep_size, int ep_rank, Backend& backend)
    : config_(config), ep_size_(ep_size), ep_rank_(ep_rank), backend_(&backend) {
    config.validate(ep_size);
    MT_CHECK(ep_rank >= 0 && ep_rank < ep_size, "[dispatch] rank {} is not in an EP group of {}",
             ep_rank, ep_size);
    local_experts_ = config.local_experts(ep_size);
    first_expert_ = ep_rank * local_experts_;
    capacity_ = config.capacity_rows(ep_size);
    staging_copy_begin_.resize(static_cast<size_t>(ep_size * config.max_tokens) + 1);
    copy_expert_row_.resize(static_cast<size_t>(capacity_));
    copy_choice_.resize(static_cast<size_t>(capacity_));
    copy_weight_.resize(static_cast<size_t>(capacity_));
    expert_offsets_.resize(static_cast<size_t>(local_experts_) + 1);
    rows_by_source_.resize(static_cast<size_t>(ep_size * local_experts_));
}

void ExpertSide::build(const int32_t* records, int64_t num_staging, const std::string& group_name) {
    const int64_t total = backend_->dispatch_expert_layout(
        expert_offsets_.data(), staging_copy_begin_.data(), copy_expert_row_.data(),
        copy_choice_.data(), copy_weight_.data(), rows_by_source_.data(), records, num_staging,
        config_.top_k, first_expert_, local_experts_, ep_size_, capacity_);
    MT_CHECK(total <= capacity_,
             "[dispatch_layout] rank {} of group '{}' receives {} rows for its {} experts, but the "
             "dispatch buffer holds {} (pair_capacity_rows); raise it, up to the worst case {}",
             ep_rank_, group_name, total, local_experts_, capacity_,
             config_.worst_case_recv_rows(ep_size_));
    num_staging_ = num_staging;
    num_rows_ = total;
}

void ExpertSide::expand(float* expert_rows, const float* staging, bool weighted) const {
    backend_->dispatch_expand(expert_rows, staging, staging_copy_begin_.data(),
                              copy_expert_row_.data(), weighted ? copy_weight_.data() : nullptr,
                              num_staging_, config_.hidden);
}

void ExpertSide::reduce(float* staging, const float* expert_rows, bool weighted) const {
    backend_->dispatch_reduce(staging, expert_rows, staging_copy_begin_.data(),
                              copy_expert_row_.data(), weighted ? copy_weight_.data() : nullptr,
                              num_staging_, config_.hidden);
}

void ExpertSide::weight_grads(float* dweights, const float* dout, const float* expert_out) const {
    backend_->dispatch_weight_grads(dweights, dout, expert_out, staging_copy_begin_.data(),
                                    copy_expert_row_.data(), copy_choice_.data(), num_staging_,
                                    config_.top_k, config_.hidden);
}

// ---- RouteBuffer ----

ArenaPlan RouteBuffer::plan(const DispatchConfig& config, std::span<const HopSpec> hops) {
    MT_CHECK(!hops.empty(), "[dispatch] a route needs at least one hop");
    ArenaPlan p("dispatch_buffer");
    const int64_t W = row_width(config), words = config.record_words();
    for (const HopSpec& h : hops) {
        p.add(h.name + ".send_rows", Shape{h.max_slots, W});
        p.add(h.name + ".recv_rows", Shape{h.max_recv, W});
        p.add(h.name + ".send_records", Shape{h.max_slots, words}, DType::i32);
        p.add(h.name + ".recv_records", Shape{h.max_recv, words}, DType::i32);
    }
    p.add("token_records", Shape{config.max_tokens, words}, DType::i32);
    p.add("staging_weights", Shape{hops.back().max_recv, config.top_k});
    if (config.token_format != Precision::fp32) {
        p.add("token_packed", Shape{config.max_tokens, config.token_row_bytes()}, DType::u8);
        p.add("staging_decoded", Shape{hops.back().max_recv, config.hidden});
    }
    return p;
}

RouteBuffer::RouteBuffer(const DispatchConfig& config, int ep_size, std::span<const HopSpec> hops,
                         Backend& backend)
    : config_(config),
      ep_size_(ep_size),
      backend_(&backend),
      arena_(plan(config, hops), backend.memory()),
      codec_(config.token_format, config.hidden, backend) {
    for (const HopSpec& h : hops) {
        HopBuffers b;
        b.send = arena_.view(h.name + ".send_rows").f32();
        b.recv = arena_.view(h.name + ".recv_rows").f32();
        b.send_records = arena_.view(h.name + ".send_records").ptr<int32_t>();
        b.recv_records = arena_.view(h.name + ".recv_records").ptr<int32_t>();
        hops_.push_back(b);
    }
    token_records_ = arena_.view("token_records").ptr<int32_t>();
    staging_weights_ = arena_.view("staging_weights").f32();
    if (config.token_format != Precision::fp32) {
        token_packed_ = arena_.view("token_packed").ptr<uint8_t>();
        staging_decoded_ = arena_.view("staging_decoded").f32();
    }
}

// ---- Route ----

Route::Route(const DispatchConfig& config, int ep_size, int ep_rank, std::vector<HopSpec> hops,
             Backend& backend)
    : config_(config),
      ep_size_(ep_size),
      ep_rank_(ep_rank),
      backend_(&backend),
      experts_(config, ep_size, ep_rank, backend),
      rows_to_rank_(static_cast<size_t>(ep_size)) {
    for (HopSpec& h : hops)
        hops_.emplace_back(std::move(h), config.hidden, config.top_k, config.token_row_bytes(),
                           backend);
}

void Route::check(const RouteBuffer& buffer, std::span<Communicator* const> groups,
                  const char* op) const {
    MT_CHECK(groups.size() == hops_.size(), "[{}] {} groups given for a route of {} hops", op,
             groups.size(), hops_.size());
    MT_CHECK(&buffer.backend() == backend_,
             "[{}] the dispatch buffer lives in backend '{}' memory, the route runs on '{}'", op,
             buffer.backend().name(), backend_->name());
    const DispatchConfig& b = buffer.config();
    bool fits = buffer.ep_size() == ep_size_ && buffer.num_hops() == hops_.size() &&
                b.hidden == config_.hidden && b.top_k == config_.top_k &&
                b.max_tokens >= config_.max_tokens && b.token_format == config_.token_format &&
                b.pair_rows(ep_size_) >= config_.pair_rows(ep_size_);
    MT_CHECK(fits,
             "[{}] the dispatch buffer (D {}, K {}, max_tokens {}, {} rows, ep {}, {} hops, {} "
             "tokens) does not fit the layout (D {}, K {}, max_tokens {}, {} rows, ep {}, {} "
             "hops, {} tokens)",
             op, b.hidden, b.top_k, b.max_tokens, b.capacity_rows(buffer.ep_size()),
             buffer.ep_size(), buffer.num_hops(), precision_name(b.token_format), config_.hidden,
             config_.top_k, config_.max_tokens, config_.capacity_rows(ep_size_), ep_size_,
             hops_.size(), precision_name(config_.token_format));
}

void Route::check_pair_budget() const {
    if (!config_.can_overflow(ep_size_)) return;
    const auto most = std::max_element(rows_to_rank_.begin(), rows_to_rank_.end());
    MT_CHECK(*most <= config_.pair_rows(ep_size_),
             "[dispatch_layout] rank {} sends {} rows to EP rank {}, more than the {} planned "
             "(pair_capacity_rows); split the tokens into rounds (ExpertDispatcher::plan_rounds)",
             ep_rank_, *most, most - rows_to_rank_.begin(), config_.pair_rows(ep_size_));
}

void Route::plan(const int32_t* topk_ids, const float* topk_weights, int64_t num_tokens,
                 RouteBuffer& buffer, std::span<Communicator* const> groups) {
    check(buffer, groups, "dispatch_layout");
    MT_CHECK(num_tokens >= 0 && num_tokens <= config_.max_tokens,
             "[dispatch_layout] {} tokens, but the layout holds at most max_tokens = {}",
             num_tokens, config_.max_tokens);
    MT_CHECK(topk_weights != nullptr || num_tokens == 0, "[dispatch_layout] topk_weights is null");
    const int64_t K = config_.top_k;

    // The tokens' route records (the expert ids checked), then the copies per EP rank and the
    // spread (DeepEP's get_dispatch_layout).
    int32_t* records = buffer.token_records();
    backend_->dispatch_route_records(records, topk_ids, topk_weights, num_tokens, K,
                                     config_.num_experts, ep_rank_);
    spread_ = backend_->dispatch_layout(rows_to_rank_.data(), topk_ids, num_tokens, K,
                                        config_.local_experts(ep_size_),
                                        config_.ranks_per_domain(ep_size_), ep_size_);
    check_pair_budget();

    // Each hop from the records of its input rows: the tokens', then what the previous received.
    const int32_t* inputs = records;
    int64_t num_inputs = num_tokens;
    for (size_t h = 0; h < hops_.size(); ++h) {
        hops_[h].plan(inputs, num_inputs, buffer.hop(h), *groups[h], buffer.bytes_sent());
        inputs = buffer.hop(h).recv_records;
        num_inputs = hops_[h].num_recv();
    }
    num_tokens_ = num_tokens;
    experts_.build(inputs, num_inputs, groups.back()->name());
}

// ---- RouteTransfer: one movement in flight ----

RouteTransfer::~RouteTransfer() {
    if (buffer_ != nullptr && buffer_->in_flight == this) buffer_->in_flight = nullptr;
}

void Route::start(RouteTransfer& t, RouteTransfer::Movement movement, RouteBuffer& buffer,
                  std::span<Communicator* const> groups, const char* op) const {
    MT_CHECK(!t.in_flight(), "[{}] the routing has a movement in flight; finish it first", op);
    MT_CHECK(buffer.in_flight == nullptr,
             "[{}] the dispatch buffer carries another routing's movement; routings in flight at "
             "once need a buffer each",
             op);
    MT_CHECK(groups.size() == hops_.size(), "[{}] {} groups given for a route of {} hops", op,
             groups.size(), hops_.size());
    t.movement_ = movement;
    t.step_ = 0;
    t.buffer_ = &buffer;
    t.groups_ = groups;
    buffer.in_flight = &t;
}

void Route::post_forward(RouteTransfer& t, size_t k, const void* token_rows) const {
    const HopBuffers& b = t.buffer_->hop(k);
    const void* input = k == 0 ? token_rows : t.buffer_->hop(k - 1).recv;
    t.handle_ = hops_[k].fan_out(b.recv, b.send, input, t.forward_payload_, *t.groups_[k],
                                 t.buffer_->bytes_sent());
}

// The return walks the hops backwards: step k is hop h = H-1-k, whose received rows are the
// staging rows for the last hop and the previous hop's receive buffer otherwise (which the step
// after it reads: recv of hop h-1 is where hop h's sums land).
void Route::post_return(RouteTransfer& t, size_t k, const float* last_recv, Payload payload) const {
    const size_t h = hops_.size() - 1 - k;
    const float* recv = k == 0 ? last_recv : t.buffer_->hop(h).recv;
    t.handle_ = hops_[h].fan_in_post(t.buffer_->hop(h).send, recv, payload, *t.groups_[h],
                                     t.buffer_->bytes_sent());
}

void Route::sum_return(const RouteTransfer& t, size_t k, float* token_out, const float* last_recv,
                       Payload payload, bool accumulate) const {
    const size_t h = hops_.size() - 1 - k;
    const float* recv = k == 0 ? last_recv : t.buffer_->hop(h).recv;
    float* out = h == 0 ? token_out : t.buffer_->hop(h - 1).recv;
    hops_[h].fan_in_sum(out, t.buffer_->hop(h).send, recv, payload, accumulate && h == 0);
}

void Route::begin_to_experts(RouteTransfer& t, float* expert_rows, const float* token_rows,
                             bool weighted, Precision token_format, RouteBuffer& buffer,
                             std::span<Communicator* const> groups) const {
    config_.check_token_format(token_format);
    start(t, RouteTransfer::Movement::to_experts, buffer, groups, "dispatch");
    t.out_ = expert_rows;
    t.in_ = token_rows;
    t.weighted_ = weighted;
    if (token_format == Precision::fp32) {
        t.forward_payload_ = Payload::rows;
        post_forward(t, 0, token_rows);
        return;
    }
    // The tokens leave in the wire format, once each, and are decoded where the experts are.
    t.forward_payload_ = Payload::packed_rows;
    buffer.codec().encode(buffer.token_packed(), token_rows, num_tokens_);
    post_forward(t, 0, buffer.token_packed());
}

void Route::begin_to_tokens(RouteTransfer& t, float* token_rows, const float* expert_rows,
                            bool weighted, bool accumulate, RouteBuffer& buffer,
                            std::span<Communicator* const> groups) const {
    start(t, RouteTransfer::Movement::to_tokens, buffer, groups, "combine");
    t.out_ = token_rows;
    t.in_ = expert_rows;
    t.weighted_ = weighted;
    t.accumulate_ = accumulate;
    experts_.reduce(staging(buffer), expert_rows, weighted);
    post_return(t, 0, staging(buffer), Payload::rows);
}

void Route::begin_combine_grads(RouteTransfer& t, float* dexpert_out, float* dweights,
                                const float* dout, const float* expert_out, RouteBuffer& buffer,
                                std::span<Communicator* const> groups) const {
    MT_CHECK(dweights != nullptr || num_tokens_ == 0,
             "[combine_backward] dweights is null (its return is a collective every rank joins)");
    start(t, RouteTransfer::Movement::combine_grads, buffer, groups, "combine_backward");
    t.out_ = dexpert_out;
    t.in_ = dout;
    t.dweights_ = dweights;
    t.expert_out_ = expert_out;
    t.weighted_ = true;
    t.forward_payload_ = Payload::rows;
    post_forward(t, 0, dout);
}

void Route::advance(RouteTransfer& t) const {
    if (!t.in_flight()) return;
    t.handle_.wait();
    const size_t H = hops_.size(), k = static_cast<size_t>(t.step_);
    RouteBuffer& buffer = *t.buffer_;
    bool done = false;
    switch (t.movement_) {
        case RouteTransfer::Movement::to_experts:
            if (k + 1 < H) {
                post_forward(t, k + 1, t.in_);
            } else if (t.forward_payload_ == Payload::packed_rows) {
                buffer.codec().decode(buffer.staging_decoded(),
                                      reinterpret_cast<const uint8_t*>(staging(buffer)),
                                      hops_.back().num_recv());
                experts_.expand(t.out_, buffer.staging_decoded(), t.weighted_);
                done = true;
            } else {
                experts_.expand(t.out_, staging(buffer), t.weighted_);
                done = true;
            }
            break;
        case RouteTransfer::Movement::to_tokens:
            sum_return(t, k, t.out_, staging(buffer), Payload::rows, t.accumulate_);
            if (k + 1 < H) post_return(t, k + 1, staging(buffer), Payload::rows);
            done = k + 1 == H;
            break;
        case RouteTransfer::Movement::combine_grads:
            // Steps [0, H): dout to the experts, weighted; [H, 2H): the weight gradients back.
            if (k + 1 < H) {
                post_forward(t, k + 1, t.in_);
            } else if (k + 1 == H) {
                experts_.expand(t.out_, staging(buffer), /*weighted=*/true);
                // The staging rows still hold dout, one row per (token, this rank).
                experts_.weight_grads(buffer.staging_weights(), staging(buffer), t.expert_out_);
                post_return(t, 0, buffer.staging_weights(), Payload::weights);
            } else {
                sum_return(t, k - H, t.dweights_, buffer.staging_weights(), Payload::weights,
                           false);
                if (k + 1 < 2 * H)
                    post_return(t, k + 1 - H, buffer.staging_weights(), Payload::weights);
                done = k + 1 == 2 * H;
            }
            break;
        case RouteTransfer::Movement::none:
            break;
    }
    ++t.step_;
    if (done) {
        t.movement_ = RouteTransfer::Movement::none;
        buffer.in_flight = nullptr;
    }
}

void Route::finish(RouteTransfer& t) const {
    while (t.in_flight()) advance(t);
}

void Route::post_next(RouteTransfer& t) const {
    if (t.in_flight() && t.step_ + 1 < t.num_steps(hops_.size())) advance(t);
}

void Route::to_experts(float* expert_rows, const float* token_rows, bool weighted,
                       Precision token_format, RouteBuffer& buffer,
                       std::span<Communicator* const> groups) const {
    RouteTransfer t;
    begin_to_experts(t, expert_rows, token_rows, weighted, token_format, buffer, groups);
    finish(t);
}

void Route::to_tokens(float* token_rows, const float* expert_rows, bool weighted,
                      RouteBuffer& buffer, std::span<Communicator* const> groups) const {
    RouteTransfer t;
    begin_to_tokens(t, token_rows, expert_rows, weighted, /*accumulate=*/false, buffer, groups);
    finish(t);
}

void Route::combine_grads(float* dexpert_out, float* dweights, const float* dout,
                          const float* expert_out, RouteBuffer& buffer,
                          std::span<Communicator* const> groups) const {
    RouteTransfer t;
    begin_combine_grads(t, dexpert_out, dweights, dout, expert_out, buffer, groups);
    finish(t);
}

}  // namespace moetron::parallel

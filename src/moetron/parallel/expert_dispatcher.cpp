#include "moetron/parallel/expert_dispatcher.h"

#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/permute.h"
#include "moetron/parallel/dispatch_flat.h"

namespace moetron::parallel {

namespace {

void check_config(const ExpertDispatchConfig& c) {
    MT_CHECK(c.num_experts >= 1 && c.top_k >= 1 && c.top_k <= c.num_experts && c.hidden >= 1 &&
                 c.max_tokens >= 0 && c.num_slots >= 0,
             "[expert_dispatch] bad config: E {} K {} D {} max_tokens {} slots {}", c.num_experts,
             c.top_k, c.hidden, c.max_tokens, c.num_slots);
}

void check_slot(int64_t slot, int64_t num_slots) {
    MT_CHECK(slot >= 0 && slot < num_slots, "[expert_dispatch] slot {} is not in [0, {})", slot,
             num_slots);
}

// Every expert here: the copies sorted by expert, stably in the copy index (the same order as the
// flat dispatcher with one rank).
class LocalDispatcher final : public ExpertDispatcher {
  public:
    explicit LocalDispatcher(const ExpertDispatchConfig& c) : config_(c) {
        check_config(c);
        num_local_experts_ = c.num_experts;
        first_local_expert_ = 0;
        slots_.resize(static_cast<size_t>(c.num_slots));
        for (Slot& s : slots_) {
            s.copy_to_row.resize(static_cast<size_t>(c.max_tokens * c.top_k));
            s.expert_offsets.resize(static_cast<size_t>(c.num_experts + 1));
        }
    }

    const char* kind() const override { return "local"; }
    int64_t capacity_rows() const override { return config_.max_tokens * config_.top_k; }
    size_t buffer_bytes() const override {
        size_t bytes = 0;
        for (const Slot& s : slots_)
            bytes +=
                s.copy_to_row.size() * sizeof(int32_t) + s.expert_offsets.size() * sizeof(int64_t);
        return bytes;
    }

    void route(int64_t slot, const int32_t* topk_ids, int64_t num_tokens) override {
        MT_CHECK(num_tokens >= 0 && num_tokens <= config_.max_tokens,
                 "[expert_dispatch] {} tokens, but the dispatcher holds at most {}", num_tokens,
                 config_.max_tokens);
        Slot& s = at(slot);
        s.num_tokens = num_tokens;
        cpu::moe_permute_layout(s.copy_to_row.data(), s.expert_offsets.data(), topk_ids, num_tokens,
                                config_.top_k, config_.num_experts);
    }
    int64_t num_expert_rows(int64_t slot) const override {
        return at(slot).num_tokens * config_.top_k;
    }
    std::span<const int64_t> expert_offsets(int64_t slot) const override {
        return at(slot).expert_offsets;
    }

    void dispatch_forward(int64_t slot, float* expert_inp, const float* inp) override {
        const Slot& s = at(slot);
        cpu::permute_forward(expert_inp, inp, s.copy_to_row.data(), s.num_tokens, config_.top_k,
                             config_.hidden);
    }
    void combine_forward(int64_t slot, float* out, const float* expert_out,
                         const float* weights) override {
        const Slot& s = at(slot);
        cpu::unpermute_forward(out, expert_out, weights, s.copy_to_row.data(), s.num_tokens,
                               config_.top_k, config_.hidden);
    }
    void combine_backward(int64_t slot, float* dexpert_out, float* dweights, const float* dout,
                          const float* weights, const float* expert_out) override {
        const Slot& s = at(slot);
        cpu::unpermute_backward(dexpert_out, dweights, dout, expert_out, weights,
                                s.copy_to_row.data(), s.num_tokens, config_.top_k, config_.hidden);
    }
    void dispatch_backward(int64_t slot, float* dinp, const float* dexpert_inp) override {
        const Slot& s = at(slot);
        cpu::permute_backward(dinp, dexpert_inp, s.copy_to_row.data(), s.num_tokens, config_.top_k,
                              config_.hidden);
    }

  private:
    struct Slot {
        int64_t num_tokens = 0;
        std::vector<int32_t> copy_to_row;     // (max_tokens * K)
        std::vector<int64_t> expert_offsets;  // (E + 1)
    };
    Slot& at(int64_t slot) {
        check_slot(slot, config_.num_slots);
        return slots_[static_cast<size_t>(slot)];
    }
    const Slot& at(int64_t slot) const {
        check_slot(slot, config_.num_slots);
        return slots_[static_cast<size_t>(slot)];
    }

    ExpertDispatchConfig config_;
    std::vector<Slot> slots_;
};

// Experts split over the EP group; one DispatchLayout per slot and one shared DispatchBuffer.
class FlatDispatcher final : public ExpertDispatcher {
  public:
    FlatDispatcher(const ExpertDispatchConfig& c, Communicator& ep)
        : ep_(ep), flat_config_(flat_config(c)), buffer_(flat_config_, ep.size()) {
        check_config(c);
        num_local_experts_ = flat_config_.local_experts(ep.size());
        first_local_expert_ = static_cast<int64_t>(ep.rank()) * num_local_experts_;
        slots_.reserve(static_cast<size_t>(c.num_slots));
        for (int64_t i = 0; i < c.num_slots; ++i) {
            slots_.push_back(
                {DispatchLayout(flat_config_, ep.size()),
                 std::vector<float>(static_cast<size_t>(c.max_tokens * c.top_k * c.hidden))});
        }
        num_slots_ = c.num_slots;
    }

    const char* kind() const override { return "flat"; }
    int64_t capacity_rows() const override { return flat_config_.capacity_rows(ep_.size()); }
    size_t buffer_bytes() const override {
        size_t bytes = buffer_.size_bytes();
        for (const Slot& s : slots_) bytes += s.returned_rows.size() * sizeof(float);
        return bytes;  // the layouts' index arrays are small next to the rows
    }

    void route(int64_t slot, const int32_t* topk_ids, int64_t num_tokens) override {
        dispatch_layout(at(slot).layout, topk_ids, num_tokens, ep_);
    }
    int64_t num_expert_rows(int64_t slot) const override { return at(slot).layout.num_recv_rows(); }
    std::span<const int64_t> expert_offsets(int64_t slot) const override {
        return at(slot).layout.expert_offsets();
    }

    void dispatch_forward(int64_t slot, float* expert_inp, const float* inp) override {
        parallel::dispatch_forward(expert_inp, inp, at(slot).layout, buffer_, ep_);
    }
    void combine_forward(int64_t slot, float* out, const float* expert_out,
                         const float* weights) override {
        Slot& s = at(slot);
        parallel::combine_forward(out, s.returned_rows.data(), expert_out, weights, s.layout,
                                  buffer_, ep_);
    }
    void combine_backward(int64_t slot, float* dexpert_out, float* dweights, const float* dout,
                          const float* weights, const float* /*expert_out*/) override {
        Slot& s = at(slot);
        parallel::combine_backward(dexpert_out, dweights, dout, weights, s.returned_rows.data(),
                                   s.layout, buffer_, ep_);
    }
    void dispatch_backward(int64_t slot, float* dinp, const float* dexpert_inp) override {
        parallel::dispatch_backward(dinp, dexpert_inp, at(slot).layout, buffer_, ep_);
    }

  private:
    struct Slot {
        DispatchLayout layout;
        std::vector<float> returned_rows;  // (max_tokens * K, D): combine_forward's, for dweights
    };
    static DispatchConfig flat_config(const ExpertDispatchConfig& c) {
        DispatchConfig d;
        d.num_experts = c.num_experts;
        d.top_k = c.top_k;
        d.hidden = c.hidden;
        d.max_tokens = c.max_tokens;
        d.recv_capacity_rows = c.recv_capacity_rows;
        return d;
    }
    Slot& at(int64_t slot) {
        check_slot(slot, num_slots_);
        return slots_[static_cast<size_t>(slot)];
    }
    const Slot& at(int64_t slot) const {
        check_slot(slot, num_slots_);
        return slots_[static_cast<size_t>(slot)];
    }

    Communicator& ep_;
    DispatchConfig flat_config_;
    DispatchBuffer buffer_;
    std::vector<Slot> slots_;
    int64_t num_slots_ = 0;
};

}  // namespace

std::unique_ptr<ExpertDispatcher> make_expert_dispatcher(const ExpertDispatchConfig& config,
                                                         Communicator* ep) {
    if (ep == nullptr || ep->size() == 1) return std::make_unique<LocalDispatcher>(config);
    return std::make_unique<FlatDispatcher>(config, *ep);
}

}  // namespace moetron::parallel

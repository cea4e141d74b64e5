// The parameter table: every tensor of the model with its shape, initialization, weight-decay and
// trainable flags (TensorSpec), packed back to back into one flat float buffer (ParamTable). The
// model's parameter and gradient arenas use this layout; sim/ and checkpoints read the same list.
//
// Each layer file lists its own tensors once, in a bind_*_params(ParamBinder&, ...) function: run
// with a collecting binder it appends TensorSpecs, run with a binding binder it points the layer's
// struct of pointers at the parameters (or, with the same layout, at the gradients). Activations
// work the same way through BufferBinder and an ArenaPlan/Arena. One list per layer, so the plan
// and the pointers can never disagree.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/core/tensor.h"
#include "moetron/model/config.h"

namespace moetron {

class Backend;  // kernels/backend.h

enum class ParamInit : uint8_t {
    normal,  // N(0, initializer_range): projections, embedding, router gate
    ones,    // RMSNorm gains
    zeros,   // the router correction bias
};

// How a tensor is split over the tensor-parallel group (Megatron-LM's parallel linear layers). The
// global tensor is (rows, cols) in the HF (out_features, in_features) layout:
//   rows: column-parallel (output features split); the rows hold `blocks` equal blocks (the fused
//         [gate; up] holds 2), each split evenly, so rank r keeps rows [r*b, (r+1)*b) of every
//         block
//   cols: row-parallel (input features split); rank r keeps columns [r*c, (r+1)*c) of every row
struct TensorParallelShard {
    enum class Split : uint8_t { replicated, rows, cols };
    Split split = Split::replicated;
    int64_t blocks = 1;  // rows only
    int rank = 0;
    int size = 1;
    Shape global_shape;  // empty when replicated

    bool sharded() const { return split != Split::replicated; }
    // The local shard (local_numel floats) as `count` contiguous runs of `length` floats, back to
    // back in the shard; run i starts at global index global_first + i * global_stride of the
    // global tensor. One run when replicated, one per row block (rows), one per row (cols).
    struct Runs {
        int64_t count = 1;
        int64_t length = 0;
        int64_t global_first = 0;
        int64_t global_stride = 0;
    };
    Runs runs(int64_t local_numel) const;
    // Calls fn(local_offset, global_offset, count) for each run.
    template <class Fn>
    void for_each_run(int64_t local_numel, Fn&& fn) const;
};

struct TensorSpec {
    std::string name;  // moetron name, e.g. "layers.3.attn.q_b_proj"
    Shape shape;       // projections in the Hugging Face layout (out_features, in_features)
    ParamInit init = ParamInit::normal;
    float init_stddev = 0.0f;  // for ParamInit::normal
    bool weight_decay = true;  // false for norms and biases
    bool trainable = true;     // false for the router correction bias (updated by load, not grad)
    TensorParallelShard tp{};  // shape is the local shard's when tp.sharded()
    int64_t numel() const { return shape.numel(); }
};

struct ParamEntry {
    std::string name;  // moetron name, e.g. "layers.3.mlp.experts.gate_up"
    Shape shape;
    int64_t offset = 0;  // in floats, into params() / grads()
    int64_t numel = 0;
    bool weight_decay = true;  // false for norms and biases
    bool trainable = true;     // false for the router correction bias (updated by load, not grad)
    TensorParallelShard tp{};  // how this rank's tensor sits in the global one
};

// The packed layout: entries back to back in spec order, no padding, so the flat buffer holds
// exactly the model's parameter count.
class ParamTable {
  public:
    explicit ParamTable(std::vector<TensorSpec> specs);

    const std::vector<TensorSpec>& specs() const { return specs_; }
    const std::vector<ParamEntry>& entries() const { return entries_; }
    int64_t total_numel() const { return total_numel_; }
    const ParamEntry* find(std::string_view name) const;   // null when unknown
    const ParamEntry& entry(std::string_view name) const;  // throws naming the tensor

    // Fills params (total_numel floats, in ops' memory): element i of tensor P from ParamRng(seed,
    // P's name) at global index i, so any shard of P initializes identically; gains 1, biases 0.
    // One init_normal or fill op per tensor.
    void initialize(Backend& ops, float* params, uint64_t seed) const;

  private:
    std::vector<TensorSpec> specs_;
    std::vector<ParamEntry> entries_;
    std::unordered_map<std::string, size_t> index_;
    int64_t total_numel_ = 0;
};

// Every tensor of the model and its MTP modules: the embedding, main layers, final norm, output
// head, then the MTP modules (defined in model_layout.cpp beside the walk that binds the same
// tree).
std::vector<TensorSpec> model_param_specs(const ModelConfig& config);

// The parameters one rank holds, counted from the TensorSpecs a Model of that layout allocates:
// tensors split over TP count their shard, tensors replicated over TP (norms, router, MLA's
// down-projections, MTP's eh_proj) count whole, the routed experts count this rank's 1/ep.
struct RankParamCount {
    int64_t dense = 0;      // everything but the routed experts: replicated over dp
    int64_t expert = 0;     // the routed experts: replicated over expert-dp
    int64_t untrained = 0;  // of dense: the router correction biases (moved by load, no moments)
    int64_t total() const { return dense + expert; }
    RankParamCount& operator+=(const RankParamCount& other);
};
// The parts a pipeline stage is made of (the cluster model places them stage by stage).
enum class ModelPart : uint8_t {
    embedding,    // vocabulary-parallel embedding
    dense_layer,  // one transformer layer with a dense MLP
    moe_layer,    // one transformer layer with an MoE
    output,       // final norm and vocabulary-parallel head
    mtp_extra,    // one MTP depth's own norms and projection, beyond its transformer layer
};
// One part on a rank of a tp x ep layout (tp must divide what the engine splits over it, ep the
// routed experts: validate_layout_for_model and validate_topology_for_model check that).
RankParamCount rank_param_count(const ModelConfig& config, ModelPart part, int64_t tp, int64_t ep);
// The whole model (main layers and MTP depths) on one rank of a tp x ep layout: the sum of its
// parts, equal to the rank's parameter table.
RankParamCount rank_param_count(const ModelConfig& config, int64_t tp, int64_t ep);

// Name prefixes: "layers.3." for main layer 3, "mtp.0." for MTP depth 1.
std::string main_layer_prefix(int64_t layer);
std::string mtp_prefix(int64_t depth);

// Collects TensorSpecs or binds pointers; see the top of this file.
class ParamBinder {
  public:
    // Collecting: appends specs (pointers are left untouched).
    ParamBinder(std::vector<TensorSpec>* specs, float init_stddev);
    // Binding: sets each pointer to base + the tensor's offset in table (base: params or grads).
    ParamBinder(const ParamTable& table, float* base);

    // This rank's place in the tensor-parallel group; the split tensors below take their shard
    // from it (default: one rank, the whole tensor).
    void set_tensor_parallel(int rank, int size);

    void weight(float*& ptr, std::string name, Shape shape);           // normal init, decayed
    void norm(float*& ptr, std::string name, int64_t dim);             // ones, not decayed
    void correction_bias(float*& ptr, std::string name, int64_t dim);  // zeros, not trained
    // A (rows, cols) weight split over the TP group by rows (column-parallel; `blocks` equal row
    // blocks each split, see TensorParallelShard) or by columns (row-parallel).
    void column_parallel_weight(float*& ptr, std::string name, Shape global_shape,
                                int64_t blocks = 1);
    void row_parallel_weight(float*& ptr, std::string name, Shape global_shape);

  private:
    void visit(float*& ptr, TensorSpec spec);
    TensorSpec split_weight(std::string name, Shape global_shape, TensorParallelShard::Split split,
                            int64_t blocks) const;

    std::vector<TensorSpec>* specs_ = nullptr;
    float init_stddev_ = 0.0f;
    const ParamTable* table_ = nullptr;
    float* base_ = nullptr;
    int tp_rank_ = 0;
    int tp_size_ = 1;
};

template <class Fn>
void TensorParallelShard::for_each_run(int64_t local_numel, Fn&& fn) const {
    const Runs r = runs(local_numel);
    for (int64_t i = 0; i < r.count; ++i)
        fn(i * r.length, r.global_first + i * r.global_stride, r.length);
}

// Plans activation buffers into an ArenaPlan, or binds pointers to them in the Arena made from it.
class BufferBinder {
  public:
    explicit BufferBinder(ArenaPlan& plan) : plan_(&plan) {}
    explicit BufferBinder(const Arena& arena) : arena_(&arena) {}

    template <class T>
    void operator()(T*& ptr, const std::string& name, Shape shape) {
        if (plan_ != nullptr) {
            plan_->add(name, shape, dtype_of<T>());
            return;
        }
        const TensorView view = arena_->view(name);
        MT_CHECK(view.shape == shape, "[model] activation '{}' planned as {}, bound as {}", name,
                 view.shape.str(), shape.str());
        ptr = view.ptr<T>();
    }

  private:
    ArenaPlan* plan_ = nullptr;
    const Arena* arena_ = nullptr;
};

}  // namespace moetron

#include "moetron/model/params.h"

#include <utility>

#include "moetron/core/rng.h"
#include "moetron/kernels/backend.h"

namespace moetron {

ParamTable::ParamTable(std::vector<TensorSpec> specs) : specs_(std::move(specs)) {
    entries_.reserve(specs_.size());
    for (const TensorSpec& s : specs_) {
        MT_CHECK(!index_.contains(s.name), "[model] parameter '{}' listed twice", s.name);
        index_.emplace(s.name, entries_.size());
        entries_.push_back(
            {s.name, s.shape, total_numel_, s.numel(), s.weight_decay, s.trainable, s.tp});
        total_numel_ = checked_add(total_numel_, s.numel(), "[model] parameter count");
    }
}

const ParamEntry* ParamTable::find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &entries_[it->second];
}

const ParamEntry& ParamTable::entry(std::string_view name) const {
    const ParamEntry* e = find(name);
    MT_CHECK(e != nullptr, "[model] no parameter named '{}'", name);
    return *e;
}

TensorParallelShard::Runs TensorParallelShard::runs(int64_t local_numel) const {
    if (split == Split::replicated) return {1, local_numel, 0, 0};
    const int64_t rows = global_shape[0], cols = global_shape[1];
    if (split == Split::rows) {
        const int64_t block_rows = rows / blocks, local_rows = block_rows / size;
        return {blocks, local_rows * cols, rank * local_rows * cols, block_rows * cols};
    }
    const int64_t local_cols = cols / size;
    return {rows, local_cols, rank * local_cols, cols};
}

void ParamTable::initialize(Backend& ops, float* params, uint64_t seed) const {
    for (size_t i = 0; i < specs_.size(); ++i) {
        const TensorSpec& spec = specs_[i];
        float* data = params + entries_[i].offset;
        const int64_t n = spec.numel();
        if (spec.init != ParamInit::normal) {
            ops.fill(data, n, spec.init == ParamInit::ones ? 1.0f : 0.0f);
            continue;
        }
        const TensorParallelShard::Runs runs = spec.tp.runs(n);
        ops.init_normal(data, seed, fnv1a_64(spec.name), runs.count, runs.length, runs.global_first,
                        runs.global_stride, spec.init_stddev);
    }
}

std::string main_layer_prefix(int64_t layer) {
    return "layers." + std::to_string(layer) + ".";
}
std::string mtp_prefix(int64_t depth) {
    return "mtp." + std::to_string(depth) + ".";
}

ParamBinder::ParamBinder(std::vector<TensorSpec>* specs, float init_stddev)
    : specs_(specs), init_stddev_(init_stddev) {}

ParamBinder::ParamBinder(const ParamTable& table, float* base) : table_(&table), base_(base) {}

void ParamBinder::weight(float*& ptr, std::string name, Shape shape) {
    visit(ptr, {std::move(name), shape, ParamInit::normal, init_stddev_, true, true});
}

void ParamBinder::norm(float*& ptr, std::string name, int64_t dim) {
    visit(ptr, {std::move(name), Shape{dim}, ParamInit::ones, 0.0f, false, true});
}

void ParamBinder::correction_bias(float*& ptr, std::string name, int64_t dim) {
    visit(ptr, {std::move(name), Shape{dim}, ParamInit::zeros, 0.0f, false, false});
}

void ParamBinder::set_tensor_parallel(int rank, int size) {
    MT_CHECK(size >= 1 && rank >= 0 && rank < size, "[model] tensor-parallel rank {} of {}", rank,
             size);
    tp_rank_ = rank;
    tp_size_ = size;
}

TensorSpec ParamBinder::split_weight(std::string name, Shape global_shape,
                                     TensorParallelShard::Split split, int64_t blocks) const {
    MT_CHECK(global_shape.ndim == 2, "[model] '{}' is split over TP, so it must be a matrix", name);
    TensorSpec spec{std::move(name), global_shape, ParamInit::normal, init_stddev_, true, true, {}};
    if (tp_size_ == 1) return spec;
    const int64_t rows = global_shape[0], cols = global_shape[1];
    if (split == TensorParallelShard::Split::rows) {
        MT_CHECK(rows % (blocks * tp_size_) == 0,
                 "[model] the {} output features of '{}' ({} block(s)) do not split over tp {}",
                 rows, spec.name, blocks, tp_size_);
        spec.shape = Shape{rows / tp_size_, cols};
    } else {
        MT_CHECK(cols % tp_size_ == 0,
                 "[model] the {} input features of '{}' do not split over tp {}", cols, spec.name,
                 tp_size_);
        spec.shape = Shape{rows, cols / tp_size_};
    }
    spec.tp = {split, blocks, tp_rank_, tp_size_, global_shape};
    return spec;
}

void ParamBinder::column_parallel_weight(float*& ptr, std::string name, Shape global_shape,
                                         int64_t blocks) {
    visit(ptr,
          split_weight(std::move(name), global_shape, TensorParallelShard::Split::rows, blocks));
}

void ParamBinder::row_parallel_weight(float*& ptr, std::string name, Shape global_shape) {
    visit(ptr, split_weight(std::move(name), global_shape, TensorParallelShard::Split::cols, 1));
}

void ParamBinder::visit(float*& ptr, TensorSpec spec) {
    if (specs_ != nullptr) {
        specs_->push_back(std::move(spec));
        return;
    }
    const ParamEntry& e = table_->entry(spec.name);
    MT_CHECK(e.shape == spec.shape, "[model] parameter '{}' is {} in the table, bound as {}",
             spec.name, e.shape.str(), spec.shape.str());
    ptr = base_ + e.offset;
}

}  // namespace moetron

#include "moetron/model/params.h"

#include <algorithm>
#include <utility>

#include "moetron/core/rng.h"

namespace moetron {

namespace {

// Elements one thread initializes at a time: large enough to amortize the scheduling, small
// enough that the big expert tensors spread over all threads.
constexpr int64_t kInitChunk = int64_t{1} << 16;

}  // namespace

ParamTable::ParamTable(std::vector<TensorSpec> specs) : specs_(std::move(specs)) {
    entries_.reserve(specs_.size());
    for (const TensorSpec& s : specs_) {
        MT_CHECK(!index_.contains(s.name), "[model] parameter '{}' listed twice", s.name);
        index_.emplace(s.name, entries_.size());
        entries_.push_back({s.name, s.shape, total_numel_, s.numel(), s.weight_decay, s.trainable});
        total_numel_ += s.numel();
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

void ParamTable::initialize(float* params, uint64_t seed) const {
    for (size_t i = 0; i < specs_.size(); ++i) {
        const TensorSpec& spec = specs_[i];
        float* data = params + entries_[i].offset;
        const int64_t n = spec.numel();
        if (spec.init != ParamInit::normal) {
            std::fill(data, data + n, spec.init == ParamInit::ones ? 1.0f : 0.0f);
            continue;
        }
        const ParamRng rng(seed, spec.name);
        const int64_t num_chunks = (n + kInitChunk - 1) / kInitChunk;
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t c = 0; c < num_chunks; ++c) {
            const int64_t first = c * kInitChunk;
            const int64_t count = std::min(kInitChunk, n - first);
            rng.fill_normal(data + first, static_cast<uint64_t>(count), spec.init_stddev,
                            static_cast<uint64_t>(first));
        }
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

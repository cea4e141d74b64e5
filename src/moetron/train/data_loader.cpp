#include "moetron/train/data_loader.h"

#include <algorithm>
#include <cmath>

#include "moetron/core/error.h"
#include "moetron/train/token_shard.h"

namespace moetron {

namespace {
constexpr uint64_t kDataStreamId = 0xDA7A;  // the sampling stream, apart from other streams
}

DataLoader::DataLoader(std::vector<int32_t> tokens, std::string source_name, int64_t vocab_size,
                       int64_t seq_len, double val_fraction, uint64_t seed)
    : tokens_(std::move(tokens)),
      source_name_(std::move(source_name)),
      seq_len_(seq_len),
      rng_(seed, kDataStreamId) {
    MT_CHECK(seq_len >= 1, "[data] seq_len must be >= 1, got {}", seq_len);
    MT_CHECK(val_fraction > 0 && val_fraction < 1, "[data] val_fraction must lie in (0, 1), got {}",
             val_fraction);
    const auto n = static_cast<int64_t>(tokens_.size());
    check_token_ids(tokens_.data(), n, vocab_size, source_name_);
    const auto num_val = static_cast<int64_t>(std::ceil(static_cast<double>(n) * val_fraction));
    num_train_tokens_ = n - num_val;
    // Both parts must hold at least one whole window of seq_len + 1 tokens.
    const int64_t need = static_cast<int64_t>(
        std::ceil(static_cast<double>(seq_len + 1) / std::min(val_fraction, 1 - val_fraction)));
    MT_CHECK(num_train_tokens_ >= seq_len + 1 && num_val >= seq_len + 1,
             "[data] '{}' holds {} tokens: too few for windows of seq_len + 1 = {} tokens in both "
             "the training part and the held-out {:.0f}% (need at least {} tokens)",
             source_name_, n, seq_len + 1, val_fraction * 100, need);
    num_val_windows_ = (num_val - 1) / seq_len;
}

void DataLoader::copy_window(int32_t* tokens_out, int32_t* targets_out, int64_t start) const {
    const int32_t* w = tokens_.data() + start;
    std::copy(w, w + seq_len_, tokens_out);
    std::copy(w + 1, w + 1 + seq_len_, targets_out);
}

void DataLoader::next_train_batch(int32_t* tokens_out, int32_t* targets_out, int64_t batch) {
    const auto num_starts = static_cast<uint64_t>(num_train_tokens_ - seq_len_);
    for (int64_t b = 0; b < batch; ++b) {
        const auto start = static_cast<int64_t>(rng_.next_below(num_starts));
        copy_window(tokens_out + b * seq_len_, targets_out + b * seq_len_, start);
    }
}

void DataLoader::val_batch(int32_t* tokens_out, int32_t* targets_out, int64_t batch,
                           int64_t index) const {
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t window = (index * batch + b) % num_val_windows_;
        copy_window(tokens_out + b * seq_len_, targets_out + b * seq_len_,
                    num_train_tokens_ + window * seq_len_);
    }
}

}  // namespace moetron

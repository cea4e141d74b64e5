// Training and validation windows from one token stream.
//
// The stream is split once: the head is training data, the tail (val_fraction of it) is held
// out. A training window is seq_len + 1 consecutive tokens starting at a uniformly drawn
// position of the head (tokens = window[0, S), targets = window[1, S]); the draws come from an
// RngStream, so the loader's whole state is the stream's state: save it with state(), restore
// it with restore(), and the next windows are the same. Validation windows are fixed,
// non-overlapping windows of the tail, so every validation measures the same tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/core/rng.h"

namespace moetron {

class DataLoader {
  public:
    // tokens: the whole stream (ids checked against vocab_size, errors name source_name).
    DataLoader(std::vector<int32_t> tokens, std::string source_name, int64_t vocab_size,
               int64_t seq_len, double val_fraction, uint64_t seed);

    // Writes batch windows: tokens_out and targets_out are (batch, seq_len).
    void next_train_batch(int32_t* tokens_out, int32_t* targets_out, int64_t batch);
    // Validation micro-batch `index`: windows index * batch ... (index + 1) * batch - 1 of the
    // tail, wrapping around when the tail has fewer.
    void val_batch(int32_t* tokens_out, int32_t* targets_out, int64_t batch, int64_t index) const;

    RngStream::State state() const { return rng_.state(); }
    void restore(RngStream::State state) { rng_ = RngStream(state); }

    int64_t seq_len() const { return seq_len_; }
    int64_t num_train_tokens() const { return num_train_tokens_; }
    int64_t num_val_tokens() const {
        return static_cast<int64_t>(tokens_.size()) - num_train_tokens_;
    }
    int64_t num_val_windows() const { return num_val_windows_; }
    const std::string& source_name() const { return source_name_; }

  private:
    void copy_window(int32_t* tokens_out, int32_t* targets_out, int64_t start) const;

    std::vector<int32_t> tokens_;
    std::string source_name_;
    int64_t seq_len_;
    int64_t num_train_tokens_;
    int64_t num_val_windows_;
    RngStream rng_;
};

}  // namespace moetron

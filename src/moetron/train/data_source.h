// Where the training tokens come from: a token file (moetron shard or llm.c .bin), a text file
// tokenized byte-level on the fly, or the built-in synthetic dataset.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace moetron {

struct TokenData {
    std::vector<int32_t> tokens;
    std::string source;       // the file, or "synthetic", for error messages
    std::string description;  // one line for the run's header
    // The synthetic dataset's exact entropy (the best reachable loss); NaN for real data.
    double entropy_nats_per_token = std::numeric_limits<double>::quiet_NaN();
};

inline constexpr int64_t kSyntheticDatasetBytes = 1 << 20;

TokenData load_token_file_data(const std::string& path, int64_t vocab_size);
// Byte-level: needs vocab_size >= 256.
TokenData load_text_file_data(const std::string& path, int64_t vocab_size);
TokenData make_synthetic_data(int64_t vocab_size, uint64_t seed,
                              int64_t num_bytes = kSyntheticDatasetBytes);

}  // namespace moetron

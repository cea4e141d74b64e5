// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11). A draw is a pure function
// of (key, counter), so element i of parameter P is drawn from (seed, name(P), i) no matter how
// P is sharded across ranks: a sharded model is exactly the unsharded model (DESIGN.md sec. 4).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace moetron {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Ten rounds of Philox4x32: four independent 32-bit random words per (counter, key).
PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// 64-bit FNV-1a of a string: stable across platforms and compilers (std::hash is not).
uint64_t fnv1a_64(std::string_view s);

// [0, 1) from the top 24 bits of a word (exactly representable in float).
inline float u32_to_unit_float(uint32_t x) {
    return static_cast<float>(x >> 8) * 0x1.0p-24f;
}

// The random source for initializing one named parameter tensor.
class ParamRng {
  public:
    ParamRng(uint64_t seed, std::string_view tensor_name);
    // The same source from fnv1a_64(tensor_name), for code that carries the hash instead of the
    // name (the init_normal op).
    ParamRng(uint64_t seed, uint64_t tensor_name_hash);
    // Uniform in [0, 1) for global element index i.
    float uniform(uint64_t i) const;
    // Standard normal for global element index i (Box-Muller on two words of one block).
    float normal(uint64_t i) const;
    // Fills out[j] = stddev * normal(first_index + j) for j < n.
    void fill_normal(float* out, uint64_t n, float stddev, uint64_t first_index = 0) const;

  private:
    PhiloxKey key_;
};

// A sequential stream (data sampling, dropout): a key and a running counter. Its whole state is
// two integers, so checkpoints save and restore it exactly.
class RngStream {
  public:
    struct State {
        uint64_t key = 0;
        uint64_t counter = 0;  // 32-bit words drawn so far
    };

    RngStream(uint64_t seed, uint64_t stream_id);
    explicit RngStream(State s) : state_(s) {}

    uint32_t next_u32();
    uint64_t next_u64();
    // Uniform in [0, n) without modulo bias (Lemire's method). n must be > 0.
    uint64_t next_below(uint64_t n);
    double next_unit_double();  // [0, 1)

    State state() const { return state_; }

  private:
    State state_;
    PhiloxCounter block_{};              // cache of the Philox block holding word state_.counter
    uint64_t block_index_ = UINT64_MAX;  // which block block_ holds
};

}  // namespace moetron

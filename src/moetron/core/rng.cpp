#include "moetron/core/rng.h"

#include <cmath>
#include <numbers>

#include "moetron/core/error.h"

namespace moetron {

namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
    const uint64_t p = static_cast<uint64_t>(a) * b;
    hi = static_cast<uint32_t>(p >> 32);
    lo = static_cast<uint32_t>(p);
}

// splitmix64 finalizer: spreads seed and name bits over the whole key.
uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__extension__ typedef unsigned __int128 uint128;  // GCC/Clang extension for the 64x64 multiply

PhiloxKey key_from(uint64_t k) {
    return {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
}

}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
    for (int round = 0; round < 10; ++round) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(kPhiloxM0, c[0], hi0, lo0);
        mulhilo(kPhiloxM1, c[2], hi1, lo1);
        c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
        k[0] += kPhiloxW0;
        k[1] += kPhiloxW1;
    }
    return c;
}

uint64_t fnv1a_64(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) {
        h ^= ch;
        h *= 0x100000001b3ull;
    }
    return h;
}

ParamRng::ParamRng(uint64_t seed, std::string_view tensor_name)
    : ParamRng(seed, fnv1a_64(tensor_name)) {}

ParamRng::ParamRng(uint64_t seed, uint64_t tensor_name_hash)
    : key_(key_from(mix64(seed) ^ tensor_name_hash)) {}

float ParamRng::uniform(uint64_t i) const {
    const PhiloxCounter r =
        philox4x32_10({static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), 0, 0}, key_);
    return u32_to_unit_float(r[0]);
}

float ParamRng::normal(uint64_t i) const {
    const PhiloxCounter r =
        philox4x32_10({static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), 0, 0}, key_);
    // u1 in (0, 1] so that log(u1) is finite.
    const double u1 = (static_cast<double>(r[0]) + 1.0) * 0x1.0p-32;
    const double u2 = static_cast<double>(r[1]) * 0x1.0p-32;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                              std::cos(2.0 * std::numbers::pi * u2));
}

void ParamRng::fill_normal(float* out, uint64_t n, float stddev, uint64_t first_index) const {
    for (uint64_t j = 0; j < n; ++j) out[j] = stddev * normal(first_index + j);
}

RngStream::RngStream(uint64_t seed, uint64_t stream_id)
    : state_{mix64(seed) ^ mix64(stream_id + 0x5851F42D4C957F2Dull), 0} {}

uint32_t RngStream::next_u32() {
    const uint64_t block = state_.counter / 4;
    if (block != block_index_) {
        block_ =
            philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 1, 0},
                          key_from(state_.key));
        block_index_ = block;
    }
    return block_[state_.counter++ % 4];
}

uint64_t RngStream::next_u64() {
    const uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
}

uint64_t RngStream::next_below(uint64_t n) {
    MT_CHECK(n > 0, "[rng] next_below(0)");
    // Lemire: multiply-shift with rejection of the biased low range.
    uint128 m = static_cast<uint128>(next_u64()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
        const uint64_t threshold = (0 - n) % n;
        while (low < threshold) {
            m = static_cast<uint128>(next_u64()) * n;
            low = static_cast<uint64_t>(m);
        }
    }
    return static_cast<uint64_t>(m >> 64);
}

double RngStream::next_unit_double() {
    return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

}  // namespace moetron

#include "moetron/train/synthetic_data.h"

#include <array>
#include <cctype>
#include <cmath>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"

namespace moetron {

namespace {

constexpr int kNumWords = 64;
constexpr int kNumStarters = 8;
constexpr int kNumSuccessors = 4;
constexpr std::array<double, kNumSuccessors> kSuccessorProbs = {0.5, 0.25, 0.15, 0.1};
constexpr double kSentenceEndProb = 0.15;
constexpr int kMinSentenceWords = 3;
constexpr double kNewlineProb = 0.2;

struct Lexicon {
    std::vector<std::string> words;
    std::vector<std::array<int, kNumSuccessors>> successors;
};

// The fixed "language": drawn from its own stream so that it does not consume the text's draws.
Lexicon make_lexicon(uint64_t seed) {
    static constexpr char kConsonants[] = "bcdfghklmnprstvwz";
    static constexpr char kVowels[] = "aeiou";
    RngStream rng(seed, /*stream_id=*/0x1E71C0);
    Lexicon lex;
    while (static_cast<int>(lex.words.size()) < kNumWords) {
        const int syllables = 1 + static_cast<int>(rng.next_below(3));
        std::string word;
        for (int s = 0; s < syllables; ++s) {
            word += kConsonants[rng.next_below(sizeof kConsonants - 1)];
            word += kVowels[rng.next_below(sizeof kVowels - 1)];
        }
        if (rng.next_below(3) == 0) word += kConsonants[rng.next_below(sizeof kConsonants - 1)];
        bool duplicate = false;
        for (const std::string& w : lex.words) duplicate |= (w == word);
        if (!duplicate) lex.words.push_back(word);
    }
    lex.successors.resize(kNumWords);
    for (auto& next : lex.successors)
        for (int& n : next) n = static_cast<int>(rng.next_below(kNumWords));
    return lex;
}

// Draws index i with probability probs[i]; adds -ln p of the outcome to entropy_nats.
template <size_t N>
int draw(RngStream& rng, const std::array<double, N>& probs, double& entropy_nats) {
    const double u = rng.next_unit_double();
    double cumulative = 0;
    for (size_t i = 0; i < N; ++i) {
        cumulative += probs[i];
        if (u < cumulative || i + 1 == N) {
            entropy_nats -= std::log(probs[i]);
            return static_cast<int>(i);
        }
    }
    return static_cast<int>(N - 1);
}

bool coin(RngStream& rng, double p_true, double& entropy_nats) {
    const bool outcome = rng.next_unit_double() < p_true;
    entropy_nats -= std::log(outcome ? p_true : 1.0 - p_true);
    return outcome;
}

}  // namespace

SyntheticText generate_synthetic_text(int64_t num_bytes, uint64_t seed) {
    MT_CHECK(num_bytes > 0, "[synthetic-data] num_bytes must be > 0, got {}", num_bytes);
    const Lexicon lex = make_lexicon(seed);
    RngStream rng(seed, /*stream_id=*/0x7E47);
    std::array<double, kNumStarters> starter_probs;
    starter_probs.fill(1.0 / kNumStarters);

    SyntheticText out;
    out.text.reserve(static_cast<size_t>(num_bytes) + 32);
    double entropy_nats = 0;
    // The rate is measured over whole sentences, before the text is cut to num_bytes.
    while (static_cast<int64_t>(out.text.size()) < num_bytes) {
        int word = draw(rng, starter_probs, entropy_nats);  // starters: the first kNumStarters
        for (int position = 0;; ++position) {
            std::string w = lex.words[static_cast<size_t>(word)];
            if (position == 0) w[0] = static_cast<char>(std::toupper(w[0]));
            if (position > 0) out.text += ' ';
            out.text += w;
            if (position + 1 >= kMinSentenceWords && coin(rng, kSentenceEndProb, entropy_nats))
                break;
            word = lex.successors[static_cast<size_t>(word)]
                                 [static_cast<size_t>(draw(rng, kSuccessorProbs, entropy_nats))];
        }
        out.text += coin(rng, kNewlineProb, entropy_nats) ? ".\n" : ". ";
    }
    const double generated_bytes = static_cast<double>(out.text.size());
    out.text.resize(static_cast<size_t>(num_bytes));
    out.entropy_nats_per_byte = entropy_nats / generated_bytes;
    return out;
}

}  // namespace moetron

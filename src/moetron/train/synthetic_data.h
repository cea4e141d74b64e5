// The built-in dataset: a deterministic, text-like byte stream from a small probabilistic
// grammar, so `moetron train` runs on a fresh clone with no download and shows learning at once.
//
// The grammar: a fixed lexicon of pronounceable words (consonant-vowel syllables); sentences
// start with one of a few starter words, each word is followed by one of its four successors
// (probabilities 0.5, 0.25, 0.15, 0.1), a sentence ends after each word with probability 0.15
// (at least 3 words) with ". " or, one time in five, ".\n"; the first letter is capitalized.
// A byte-level model must learn the spelling of every word (nearly free bytes once a word has
// begun) and the word-to-word transitions; the loss falls from ln 256 = 5.55 nats toward the
// stream's entropy, which the generator measures exactly while it draws.
#pragma once

#include <cstdint>
#include <string>

namespace moetron {

struct SyntheticText {
    std::string text;
    // -sum ln p(choice) over every random choice the generator made, per byte of text: the
    // loss a model that knew the grammar exactly would reach (the floor of the byte-level loss).
    double entropy_nats_per_byte = 0;
};

// num_bytes bytes (the last sentence is cut off there); the same seed gives the same text.
SyntheticText generate_synthetic_text(int64_t num_bytes, uint64_t seed);

}  // namespace moetron

// train/: tokenizer, token files (moetron shards and llm.c .bin), the data loader, the
// synthetic dataset.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "expect_contains.h"
#include "moetron/core/error.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/synthetic_data.h"
#include "moetron/train/token_shard.h"
#include "moetron/train/tokenizer.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::error_of;
using moetron::testing::TempDir;

namespace fs = std::filesystem;

void write_bytes(const std::string& path, const void* data, size_t bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    ASSERT_TRUE(out.good()) << path;
}

// An llm.c shard as its data_common.py writes it: 256 int32 header, then the tokens.
template <class T>
void write_llmc(const std::string& path, int32_t magic, int32_t version,
                const std::vector<T>& tokens, int32_t claimed_count = -1) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = claimed_count >= 0 ? claimed_count : static_cast<int32_t>(tokens.size());
    std::vector<char> bytes(header.size() * 4 + tokens.size() * sizeof(T));
    std::memcpy(bytes.data(), header.data(), header.size() * 4);
    std::memcpy(bytes.data() + header.size() * 4, tokens.data(), tokens.size() * sizeof(T));
    write_bytes(path, bytes.data(), bytes.size());
}

TEST(Tokenizer, ByteLevelRoundTripsAnyBytes) {
    std::string text = "Hello, world!\n";
    text += static_cast<char>(0xff);
    text += static_cast<char>(0x00);
    text += "\xc3\xa9";  // UTF-8 e-acute: two tokens
    const std::vector<int32_t> tokens = byte_encode(text);
    ASSERT_EQ(tokens.size(), text.size());
    EXPECT_EQ(tokens[0], 'H');
    EXPECT_EQ(tokens[14], 255);
    EXPECT_EQ(tokens[15], 0);
    EXPECT_EQ(byte_decode(tokens.data(), static_cast<int64_t>(tokens.size())), text);
    const int32_t bad[] = {65, 256};
    EXPECT_CONTAINS(error_of([&] { byte_decode(bad, 2); }), "token 256 at position 1");
}

TEST(TokenShard, RoundTripsAndHasTheDocumentedLayout) {
    TempDir dir;
    const std::string path = dir.file("a.tok");
    const std::vector<int32_t> tokens = {0, 1, 255, 42, 7};
    write_token_shard(path, tokens.data(), 5, 256);
    EXPECT_EQ(fs::file_size(path), kTokenShardHeaderBytes + 5 * 4);
    std::ifstream in(path, std::ios::binary);
    char header[32];
    in.read(header, 32);
    EXPECT_EQ(std::string(header, 8), "MTTOKENS");
    uint32_t version, vocab;
    uint64_t count;
    std::memcpy(&version, header + 8, 4);
    std::memcpy(&vocab, header + 12, 4);
    std::memcpy(&count, header + 16, 8);
    EXPECT_EQ(version, 1u);
    EXPECT_EQ(vocab, 256u);
    EXPECT_EQ(count, 5u);

    const TokenFile read = read_token_file(path, 256);
    EXPECT_EQ(read.tokens, tokens);
    EXPECT_EQ(read.format, "moetron shard v1");
}

TEST(TokenShard, ReadsLlmcGpt2AndLlama3Shards) {
    TempDir dir;
    const std::vector<uint16_t> gpt2 = {50256, 15496, 11, 995, 0};
    write_llmc(dir.file("gpt2.bin"), kLlmcMagicGpt2, 1, gpt2);
    const TokenFile a = read_token_file(dir.file("gpt2.bin"), 50257);
    EXPECT_EQ(a.tokens, (std::vector<int32_t>{50256, 15496, 11, 995, 0}));
    EXPECT_EQ(a.format, "llm.c uint16 (GPT-2)");

    const std::vector<uint32_t> llama = {128000, 9906, 1917, 128001};
    write_llmc(dir.file("llama.bin"), kLlmcMagicLlama3, 7, llama);
    const TokenFile b = read_token_file(dir.file("llama.bin"), 128256);
    EXPECT_EQ(b.tokens, (std::vector<int32_t>{128000, 9906, 1917, 128001}));
}

TEST(TokenShard, BadFilesGiveErrorsNamingTheFileAndTheProblem) {
    TempDir dir;
    // Missing.
    std::string e = error_of([&] { read_token_file(dir.file("missing.bin"), 256); });
    EXPECT_CONTAINS(e, dir.file("missing.bin"));
    EXPECT_CONTAINS(e, "does not exist");
    // Empty.
    write_bytes(dir.file("empty.bin"), "", 0);
    e = error_of([&] { read_token_file(dir.file("empty.bin"), 256); });
    EXPECT_CONTAINS(e, dir.file("empty.bin"));
    EXPECT_CONTAINS(e, "is empty");
    // Wrong magic: a text file.
    const std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.\n";
    write_bytes(dir.file("text.txt"), text.data(), text.size());
    e = error_of([&] { read_token_file(dir.file("text.txt"), 256); });
    EXPECT_CONTAINS(e, dir.file("text.txt"));
    EXPECT_CONTAINS(e, "is not a token file");
    // Truncated: header promises more tokens than follow (both formats), or a short header.
    const std::vector<int32_t> tokens = {1, 2, 3, 4};
    write_token_shard(dir.file("t.tok"), tokens.data(), 4, 256);
    fs::resize_file(dir.file("t.tok"), kTokenShardHeaderBytes + 10);
    e = error_of([&] { read_token_file(dir.file("t.tok"), 256); });
    EXPECT_CONTAINS(e, dir.file("t.tok"));
    EXPECT_CONTAINS(e, "is truncated");
    EXPECT_CONTAINS(e, "promises 4 tokens");
    fs::resize_file(dir.file("t.tok"), 20);
    EXPECT_CONTAINS(error_of([&] { read_token_file(dir.file("t.tok"), 256); }), "is truncated");
    write_llmc(dir.file("short.bin"), kLlmcMagicGpt2, 1, std::vector<uint16_t>{1, 2}, 3);
    e = error_of([&] { read_token_file(dir.file("short.bin"), 256); });
    EXPECT_CONTAINS(e, dir.file("short.bin"));
    EXPECT_CONTAINS(e, "is truncated");
    // Extra bytes after the promised tokens.
    write_llmc(dir.file("long.bin"), kLlmcMagicGpt2, 1, std::vector<uint16_t>{1, 2, 3}, 2);
    EXPECT_CONTAINS(error_of([&] { read_token_file(dir.file("long.bin"), 256); }),
                    "does not match the file size");
    // Unsupported version.
    write_llmc(dir.file("v2.bin"), kLlmcMagicGpt2, 2, std::vector<uint16_t>{1, 2});
    EXPECT_CONTAINS(error_of([&] { read_token_file(dir.file("v2.bin"), 256); }), "version 2");
    // Token id >= vocab.
    write_llmc(dir.file("big.bin"), kLlmcMagicGpt2, 1, std::vector<uint16_t>{1, 300, 2});
    e = error_of([&] { read_token_file(dir.file("big.bin"), 256); });
    EXPECT_CONTAINS(e, dir.file("big.bin"));
    EXPECT_CONTAINS(e, "token id 300 at position 1");
    EXPECT_CONTAINS(e, "[0, 256)");
    // Writing ids outside the vocabulary is refused too.
    const int32_t bad[] = {1, 256};
    EXPECT_CONTAINS(error_of([&] { write_token_shard(dir.file("bad.tok"), bad, 2, 256); }),
                    "token id 256");
    // A directory.
    EXPECT_CONTAINS(error_of([&] { read_token_file(dir.file(""), 256); }), "is a directory");
}

TEST(TokenShard, AHugeTokenCountIsTruncationNotAWrappedSize) {
    // 2^62 + 1 tokens of 4 bytes wrap around to 4 bytes: the size check once passed with one
    // token's worth of payload and the reader then asked for 2^62 + 1 ints (std::length_error).
    TempDir dir;
    const int32_t one_token[] = {7};
    write_token_shard(dir.file("t.tok"), one_token, 1, 256);
    const uint64_t huge_count = (uint64_t{1} << 62) + 1;
    {
        std::fstream f(dir.file("t.tok"), std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(16);
        f.write(reinterpret_cast<const char*>(&huge_count), sizeof huge_count);
    }
    const std::string e = error_of([&] { read_token_file(dir.file("t.tok"), 256); });
    EXPECT_CONTAINS(e, "is truncated");
    EXPECT_CONTAINS(e, "promises 4611686018427387905 tokens");
}

std::vector<int32_t> iota_tokens(int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = i % 251;
    return t;
}

// Token i is i: a window tells where it was drawn from, so one that reaches into the held-out
// tail (positions 900 and up here) is caught, which tokens that repeat (i % 251) would hide.
std::vector<int32_t> position_tokens(int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = i;
    return t;
}

TEST(DataLoader, WindowsAreConsecutiveTokensWithShiftedTargetsInsideTheTrainingPart) {
    constexpr int kTokens = 1000, kSeqLen = 16, kBatch = 4;
    DataLoader loader(position_tokens(kTokens), "positions", kTokens, kSeqLen,
                      /*val_fraction=*/0.1, 5);
    ASSERT_EQ(loader.num_train_tokens(), 900);
    EXPECT_EQ(loader.num_val_tokens(), 100);
    std::vector<int32_t> x(kBatch * kSeqLen), y(kBatch * kSeqLen);
    int32_t last_start = 0;
    // 2000 windows: a loader that let the last seq_len starts reach into the tail (16 of 900
    // starts) would draw one of them with probability 1 - (884/900)^2000, all but certain.
    for (int round = 0; round < 500; ++round) {
        loader.next_train_batch(x.data(), y.data(), kBatch);
        for (int b = 0; b < kBatch; ++b) {
            const int32_t* xb = x.data() + b * kSeqLen;
            const int32_t* yb = y.data() + b * kSeqLen;
            for (int t = 0; t < kSeqLen; ++t) {
                ASSERT_EQ(xb[t], xb[0] + t) << "window tokens are consecutive";
                ASSERT_EQ(yb[t], xb[t] + 1) << "targets are the next tokens";
            }
            ASSERT_LT(yb[kSeqLen - 1], loader.num_train_tokens())
                << "a training window reaches the held-out tokens from position "
                << loader.num_train_tokens();
            last_start = std::max(last_start, xb[0]);
        }
    }
    // And the draws cover the training part up to its end (the last start is 900 - 17 = 883).
    EXPECT_GT(last_start, 850);
}

TEST(DataLoader, IsDeterministicAndResumesFromItsState) {
    DataLoader a(iota_tokens(5000), "iota", 256, 32, 0.1, 42);
    DataLoader b(iota_tokens(5000), "iota", 256, 32, 0.1, 42);
    DataLoader c(iota_tokens(5000), "iota", 256, 32, 0.1, 43);
    std::vector<int32_t> xa(8 * 32), ya(8 * 32), xb(8 * 32), yb(8 * 32);
    a.next_train_batch(xa.data(), ya.data(), 8);
    b.next_train_batch(xb.data(), yb.data(), 8);
    EXPECT_EQ(xa, xb);
    c.next_train_batch(xb.data(), yb.data(), 8);
    EXPECT_NE(xa, xb) << "a different seed must draw different windows";

    // Save a's state, draw three batches, restore into a fresh loader: the same three batches.
    const RngStream::State saved = a.state();
    std::vector<std::vector<int32_t>> expected;
    for (int i = 0; i < 3; ++i) {
        a.next_train_batch(xa.data(), ya.data(), 8);
        expected.push_back(xa);
    }
    DataLoader resumed(iota_tokens(5000), "iota", 256, 32, 0.1, /*seed=*/999);
    resumed.restore(saved);
    for (int i = 0; i < 3; ++i) {
        resumed.next_train_batch(xb.data(), yb.data(), 8);
        EXPECT_EQ(xb, expected[static_cast<size_t>(i)]) << "batch " << i;
    }
}

TEST(DataLoader, ValidationWindowsAreFixedAndHeldOut) {
    DataLoader loader(iota_tokens(2000), "iota", 256, 16, 0.25, 1);
    EXPECT_EQ(loader.num_train_tokens(), 1500);
    EXPECT_EQ(loader.num_val_windows(), (500 - 1) / 16);
    std::vector<int32_t> x1(2 * 16), y1(2 * 16), x2(2 * 16), y2(2 * 16);
    loader.val_batch(x1.data(), y1.data(), 2, 0);
    EXPECT_EQ(x1[0], 1500 % 251);  // the first window starts where training data ends
    EXPECT_EQ(x1[16], 1516 % 251);
    std::vector<int32_t> t(64), u(64);
    loader.next_train_batch(t.data(), u.data(), 4);  // training draws do not move validation
    loader.val_batch(x2.data(), y2.data(), 2, 0);
    EXPECT_EQ(x1, x2);
    // Past the last window it wraps around.
    loader.val_batch(x2.data(), y2.data(), 1, loader.num_val_windows());
    EXPECT_EQ(x2[0], 1500 % 251);
}

TEST(DataLoader, RejectsTooLittleDataAndOutOfVocabularyIds) {
    std::string e = error_of([] { DataLoader(iota_tokens(100), "small.tok", 256, 64, 0.1, 1); });
    EXPECT_CONTAINS(e, "small.tok");
    EXPECT_CONTAINS(e, "too few");
    std::vector<int32_t> t = iota_tokens(1000);
    t[500] = 4000;
    e = error_of([&] { DataLoader(t, "big.tok", 256, 16, 0.1, 1); });
    EXPECT_CONTAINS(e, "big.tok");
    EXPECT_CONTAINS(e, "token id 4000 at position 500");
}

TEST(SyntheticData, IsDeterministicTextLikeAndLowEntropy) {
    const SyntheticText a = generate_synthetic_text(20000, 3);
    const SyntheticText b = generate_synthetic_text(20000, 3);
    const SyntheticText c = generate_synthetic_text(20000, 4);
    ASSERT_EQ(a.text.size(), 20000u);
    EXPECT_EQ(a.text, b.text);
    EXPECT_NE(a.text, c.text);
    int letters = 0, spaces = 0, periods = 0;
    for (char ch : a.text) {
        letters += std::isalpha(static_cast<unsigned char>(ch)) != 0;
        spaces += ch == ' ';
        periods += ch == '.';
        EXPECT_TRUE(std::isalpha(static_cast<unsigned char>(ch)) || ch == ' ' || ch == '.' ||
                    ch == '\n')
            << "unexpected byte " << static_cast<int>(ch);
    }
    EXPECT_GT(letters, 15000);
    EXPECT_GT(spaces, 2000);
    EXPECT_GT(periods, 200);
    // Far below the 5.55 nats of a uniform byte, and above zero: there is something to learn.
    EXPECT_GT(a.entropy_nats_per_byte, 0.1);
    EXPECT_LT(a.entropy_nats_per_byte, 0.6);
}

}  // namespace
}  // namespace moetron

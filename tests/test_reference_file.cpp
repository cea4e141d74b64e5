// tests/reference_file.h: the committed PyTorch dump loads with the expected entries, and
// malformed files (missing, truncated, bad magic, wrong version, bad dtype, trailing bytes) are
// errors that name the file.
#include "reference_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "moetron/core/error.h"

namespace moetron::testing {
namespace {

const std::string kTinyPath = std::string(MOETRON_SOURCE_DIR) + "/tests/data/tiny_reference.bin";

std::vector<char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string write_temp(const std::string& file_name, const std::vector<char>& bytes) {
    const auto dir = std::filesystem::path(::testing::TempDir()) / "moetron_reference_test";
    std::filesystem::create_directories(dir);
    const std::string path = (dir / file_name).string();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
}

// Expects load(path) to throw a moetron::Error whose message holds every fragment.
void expect_load_error(const std::string& path, const std::vector<std::string>& fragments) {
    try {
        ReferenceFile::load(path);
        ADD_FAILURE() << "loading " << path << " did not throw";
    } catch (const Error& e) {
        const std::string msg = e.what();
        for (const std::string& f : fragments) {
            EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
        }
    }
}

// A hand-made file in the documented format, independent of the Python writer.
struct Writer {
    std::vector<char> bytes;
    void raw(const void* p, size_t n) {
        const char* c = static_cast<const char*>(p);
        bytes.insert(bytes.end(), c, c + n);
    }
    template <class T>
    void put(T v) {
        raw(&v, sizeof v);
    }
    void header(uint32_t version, uint32_t count) {
        raw("MTREF\0\0\0", 8);
        put(version);
        put(count);
    }
    template <class T>
    void tensor(const std::string& name, uint8_t dtype, const std::vector<int64_t>& shape,
                const std::vector<T>& data) {
        put(static_cast<uint32_t>(name.size()));
        raw(name.data(), name.size());
        put(dtype);
        put(static_cast<uint8_t>(shape.size()));
        for (int64_t d : shape) put(d);
        raw(data.data(), data.size() * sizeof(T));
    }
};

Writer small_file() {
    Writer w;
    w.header(1, 3);
    w.tensor<float>("w", 0, {2, 3}, {1, 2, 3, 4, 5, 6});
    w.tensor<int32_t>("ids", 1, {4}, {7, -1, 0, 255});
    w.tensor<double>("config.eps", 2, {}, {1e-6});
    return w;
}

TEST(ReferenceFile, ReadsAHandWrittenFile) {
    const std::string path = write_temp("small.bin", small_file().bytes);
    const ReferenceFile f = ReferenceFile::load(path);
    EXPECT_EQ(f.names(), (std::vector<std::string>{"w", "ids", "config.eps"}));
    const ReferenceTensor& w = f.get("w", {2, 3});
    EXPECT_EQ(w.dtype, ReferenceDType::f32);
    EXPECT_EQ(w.f32, (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(f.get("ids").i32, (std::vector<int32_t>{7, -1, 0, 255}));
    EXPECT_TRUE(f.get("config.eps").shape.empty());
    EXPECT_EQ(f.scalar("config.eps"), 1e-6);
    EXPECT_TRUE(f.has("ids"));
    EXPECT_FALSE(f.has("nothing"));
}

TEST(ReferenceFile, UnknownNameAndWrongShapeNameTheTensorAndFile) {
    const std::string path = write_temp("names.bin", small_file().bytes);
    const ReferenceFile f = ReferenceFile::load(path);
    try {
        f.get("model.nothing.weight");
        ADD_FAILURE() << "no throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("model.nothing.weight"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    }
    try {
        f.get("w", {3, 2});
        ADD_FAILURE() << "no throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    }
}

TEST(ReferenceFile, MissingFileIsAnErrorNamingIt) {
    expect_load_error("/nonexistent/dir/tiny_reference.bin",
                      {"/nonexistent/dir/tiny_reference.bin", "cannot open"});
}

TEST(ReferenceFile, BadMagicIsAnError) {
    std::vector<char> bytes = small_file().bytes;
    bytes[0] = 'X';
    const std::string path = write_temp("bad_magic.bin", bytes);
    expect_load_error(path, {path, "bad magic"});
}

TEST(ReferenceFile, VersionMismatchIsAnError) {
    Writer w = small_file();
    const uint32_t version = 2;
    std::memcpy(w.bytes.data() + 8, &version, sizeof version);
    const std::string path = write_temp("version.bin", w.bytes);
    expect_load_error(path, {path, "version 2"});
}

TEST(ReferenceFile, UnknownDtypeAndTrailingBytesAreErrors) {
    Writer bad_dtype;
    bad_dtype.header(1, 1);
    bad_dtype.tensor<float>("x", 7, {1}, {1.0f});
    const std::string p1 = write_temp("dtype.bin", bad_dtype.bytes);
    expect_load_error(p1, {p1, "'x'", "dtype code 7"});

    Writer trailing = small_file();
    trailing.put(uint32_t{0});
    const std::string p2 = write_temp("trailing.bin", trailing.bytes);
    expect_load_error(p2, {p2, "4 unexpected bytes"});
}

TEST(ReferenceFile, TruncatedCopiesAreErrorsNamingTheFileAndTensor) {
    const std::vector<char> full = read_bytes(kTinyPath);
    ASSERT_GT(full.size(), 100u) << kTinyPath;
    // Cut inside the header, inside the first tensor's name, and inside the last tensor's data.
    const struct {
        size_t size;
        std::vector<std::string> fragments;
    } cuts[] = {
        {10, {"truncated", "the version"}},
        {8 + 4 + 4 + 4 + 3, {"truncated", "tensor #0's name"}},
        {full.size() - 3, {"truncated", "'s data"}},
    };
    for (const auto& cut : cuts) {
        const std::string path = write_temp("truncated_" + std::to_string(cut.size) + ".bin",
                                            {full.begin(), full.begin() + cut.size});
        std::vector<std::string> fragments = cut.fragments;
        fragments.push_back(path);
        expect_load_error(path, fragments);
    }
}

TEST(ReferenceFile, CommittedTinyDumpHasTheDocumentedEntries) {
    const ReferenceFile f = ReferenceFile::load(kTinyPath);
    const auto V = static_cast<int64_t>(f.scalar("config.vocab_size"));
    const auto D = static_cast<int64_t>(f.scalar("config.hidden_size"));
    const auto L = static_cast<int64_t>(f.scalar("config.num_hidden_layers"));
    const auto dense = static_cast<int64_t>(f.scalar("config.first_k_dense_replace"));
    const auto E = static_cast<int64_t>(f.scalar("config.n_routed_experts"));
    const auto F = static_cast<int64_t>(f.scalar("config.moe_intermediate_size"));
    const auto K = static_cast<int64_t>(f.scalar("config.num_experts_per_tok"));

    // Inputs and targets: targets[:, t] = inputs[:, t + 1], the last position is -1 (ignored).
    const ReferenceTensor& inputs = f.get("inputs");
    ASSERT_EQ(inputs.shape.size(), 2u);
    const int64_t B = inputs.shape[0], S = inputs.shape[1];
    const ReferenceTensor& targets = f.get("targets", {B, S});
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t s = 0; s + 1 < S; ++s) {
            EXPECT_EQ(targets.i32[b * S + s], inputs.i32[b * S + s + 1]);
        }
        EXPECT_EQ(targets.i32[b * S + S - 1], -1);
    }
    for (int32_t t : inputs.i32) EXPECT_TRUE(t >= 0 && t < V) << t;

    const ReferenceTensor& logits = f.get("logits", {B, S, V});
    EXPECT_EQ(logits.dtype, ReferenceDType::f32);
    const float loss = f.get("loss", {1}).f32[0];
    // Near-uniform predictions at initialization: the loss is close to ln(V).
    EXPECT_NEAR(loss, std::log(static_cast<double>(V)), 0.5);

    // Weights under HF names, every parameter with a gradient of its shape, and the router's
    // selection bias as a buffer without one.
    EXPECT_EQ(f.get("model.embed_tokens.weight", {V, D}).f32.size(), static_cast<size_t>(V * D));
    f.get("lm_head.weight.grad", {V, D});
    f.get("model.norm.weight.grad", {D});
    for (int64_t l = dense; l < L; ++l) {
        const std::string mlp = "model.layers." + std::to_string(l) + ".mlp.";
        f.get(mlp + "experts.gate_up_proj", {E, 2 * F, D});
        f.get(mlp + "experts.down_proj.grad", {E, D, F});
        f.get(mlp + "gate.weight.grad", {E, D});
        EXPECT_TRUE(f.has(mlp + "gate.e_score_correction_bias"));
        EXPECT_FALSE(f.has(mlp + "gate.e_score_correction_bias.grad"));
        f.get("route.layers." + std::to_string(l) + ".topk_indices", {B * S, K});
    }
    for (const std::string& name : f.names()) {
        const std::string suffix = ".grad";
        if (name.size() > suffix.size() && name.ends_with(suffix)) {
            const std::string param = name.substr(0, name.size() - suffix.size());
            EXPECT_EQ(f.get(name).shape, f.get(param).shape) << name;
        }
    }
    EXPECT_GT(f.scalar("meta.min_routing_margin"), 1e-4);
    EXPECT_GT(f.scalar("meta.tokens_moved_by_bias"), 0);
}

}  // namespace
}  // namespace moetron::testing

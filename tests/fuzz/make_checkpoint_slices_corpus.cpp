// Writes the hand-made seeds of tests/fuzz/corpus/checkpoint_slices (valid-*, invalid-*, layout-*)
// for the model of checkpoint_slices_check.h; built and run by make_checkpoint_slices_corpus.sh.
// Valid seeds are shards written by write_checkpoint_shard (and one single-process file);
// invalid ones are written the same way with pieces that do not tile, or edit a valid shard's
// "slices" JSON. Each seed is in the fuzzer's input form: per shard file "JSON header, NUL,
// data", two files joined by kNextShard; layout-* seeds are the second kind of input (the bytes
// that choose a layout, check_checkpoint_layout). The replay test checks that valid-* and
// layout-* seeds open and invalid-* seeds are rejected.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz/checkpoint_slices_check.h"
#include "moetron/checkpoint/checkpoint_pieces.h"
#include "moetron/checkpoint/safetensors.h"

namespace moetron::fuzz {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kOProj = "layers.0.attn.o_proj";            // (6, 4)
const std::string kExperts = "layers.0.mlp.experts.gate_up";  // (2, 3, 4)
const std::string kBias = "layers.0.mlp.router.bias";         // (5), not trainable

// Distinct values per part and element, so a misplaced element changes the bytes.
struct Values {
    std::vector<float> data;
    Values(size_t part, int64_t n) : data(static_cast<size_t>(n)) {
        for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(1000 * (part + 1) + i) * 0.5f;
    }
};

std::vector<int64_t> dims_of(const std::string& tensor) {
    for (const ParamEntry& e : fuzz_model_entries())
        if (e.name == tensor) return {e.shape.dims.begin(), e.shape.dims.begin() + e.shape.ndim};
    MT_THROW("[corpus] unknown tensor {}", tensor);
}

// The element values of a block's range, from the global values.
struct PieceSpec {
    std::string tensor;
    TensorBlock block;  // whole when empty
    int64_t begin = 0;
    int64_t end = -1;  // -1: the block's end
};

// A shard file's bytes in the fuzzer's form, holding every part of each spec (moments only for
// trainable tensors, unless moments_of_bias).
class ShardWriter {
  public:
    explicit ShardWriter(fs::path dir) : dir_(std::move(dir)) {}

    std::string shard(const std::vector<PieceSpec>& specs,
                      const std::vector<CheckpointPart>& parts = {std::begin(kCheckpointParts),
                                                                  std::end(kCheckpointParts)},
                      bool moments_of_bias = false) {
        std::vector<CheckpointPiece> pieces;
        std::vector<std::vector<float>> keep;
        keep.reserve(specs.size() * 3);
        for (const PieceSpec& s : specs) {
            const std::vector<int64_t> dims = dims_of(s.tensor);
            const std::vector<int64_t> extent = s.block.dims(dims);
            int64_t n = 1;
            for (int64_t d : extent) n *= d;
            const int64_t end = s.end < 0 ? n : s.end;
            for (CheckpointPart part : parts) {
                if (part != CheckpointPart::param && s.tensor == kBias && !moments_of_bias)
                    continue;
                const size_t p = static_cast<size_t>(part);
                int64_t numel = 1;
                for (int64_t d : dims) numel *= d;
                const Values global(p, numel);
                std::vector<float>& data = keep.emplace_back();
                for (const BlockRun& r : block_runs(dims, s.block, s.begin, end))
                    data.insert(data.end(), global.data.begin() + r.global_offset,
                                global.data.begin() + r.global_offset + r.count);
                pieces.push_back({part, s.tensor, dims, s.begin, end, data.data(), s.block});
            }
        }
        const fs::path path = dir_ / "shard.safetensors";
        write_checkpoint_shard(path.string(), pieces, {});
        return fuzz_form(path);
    }

    // The single-process format: whole tensors under their prefixed names, no "slices".
    std::string single_process(
        const std::vector<std::pair<std::string, std::vector<int64_t>>>& arrays) {
        SafetensorsWriter writer;
        std::vector<std::vector<float>> keep;
        keep.reserve(arrays.size());
        for (const auto& [name, dims] : arrays) {
            int64_t n = 1;
            for (int64_t d : dims) n *= d;
            keep.push_back(Values(name.starts_with("optimizer.") ? 1 : 0, n).data);
            writer.add(name, DType::f32, dims, keep.back().data());
        }
        const fs::path path = dir_ / "model.safetensors";
        writer.write(path.string());
        return fuzz_form(path);
    }

  private:
    // "JSON header, NUL, data" of a safetensors file.
    static std::string fuzz_form(const fs::path& path) {
        std::ifstream in(path, std::ios::binary);
        const std::string bytes((std::istreambuf_iterator<char>(in)), {});
        uint64_t header_bytes = 0;
        std::memcpy(&header_bytes, bytes.data(), 8);
        return bytes.substr(8, header_bytes) + '\0' + bytes.substr(8 + header_bytes);
    }
    fs::path dir_;
};

std::string two_files(const std::string& a, const std::string& b) {
    return a + std::string(kNextShard) + b;
}

// Edits the slices JSON (and, through header, the safetensors header) of a seed of one file.
std::string edit(const std::string& seed, const std::function<void(json& slices)>& edit_slices,
                 const std::function<void(json& header)>& edit_header = {}) {
    const size_t nul = seed.find('\0');
    json header = json::parse(seed.substr(0, nul));
    json slices = json::parse(header["__metadata__"]["slices"].get<std::string>());
    edit_slices(slices);
    header["__metadata__"]["slices"] = slices.dump();
    if (edit_header) edit_header(header);
    return header.dump() + seed.substr(nul);
}
// Replaces the slices string itself.
std::string with_slices_text(const std::string& seed, const std::string& text) {
    const size_t nul = seed.find('\0');
    json header = json::parse(seed.substr(0, nul));
    header["__metadata__"]["slices"] = text;
    return header.dump() + seed.substr(nul);
}

TensorBlock block(std::vector<int64_t> begin, std::vector<int64_t> end) {
    return {std::move(begin), std::move(end)};
}

int run(const fs::path& corpus) {
    char scratch_template[] = "/tmp/moetron-corpus-XXXXXX";
    MT_CHECK(::mkdtemp(scratch_template) != nullptr, "[corpus] mkdtemp failed");
    const fs::path scratch = scratch_template;
    ShardWriter w(scratch);
    std::vector<std::pair<std::string, std::string>> seeds;

    const PieceSpec o_proj{kOProj, {}}, experts{kExperts, {}}, bias{kBias, {}};
    const std::string whole = w.shard({o_proj, experts, bias});
    seeds.emplace_back("valid-whole", whole);
    seeds.emplace_back("valid-whole-bias-moments",
                       w.shard({o_proj, experts, bias},
                               {std::begin(kCheckpointParts), std::end(kCheckpointParts)}, true));
    seeds.emplace_back("valid-flat-ranges", w.shard({{kOProj, {}, 0, 7},
                                                     {kOProj, {}, 7, 24},
                                                     {kExperts, {}, 0, 13},
                                                     {kExperts, {}, 13, 24},
                                                     {kBias, {}, 0, 2},
                                                     {kBias, {}, 2, 5}}));
    seeds.emplace_back(
        "valid-row-blocks",
        w.shard({{kOProj, block({0, 0}, {3, 4})}, {kOProj, block({3, 0}, {6, 4})}, experts, bias}));
    seeds.emplace_back(
        "valid-column-blocks",
        w.shard({{kOProj, block({0, 0}, {6, 1})}, {kOProj, block({0, 1}, {6, 4})}, experts, bias}));
    seeds.emplace_back("valid-column-blocks-cut", w.shard({{kOProj, block({0, 0}, {6, 2}), 0, 5},
                                                           {kOProj, block({0, 0}, {6, 2}), 5, 12},
                                                           {kOProj, block({0, 2}, {6, 4})},
                                                           experts,
                                                           bias}));
    seeds.emplace_back("valid-expert-blocks", w.shard({o_proj,
                                                       {kExperts, block({0, 0, 0}, {1, 3, 4})},
                                                       {kExperts, block({1, 0, 0}, {2, 3, 4})},
                                                       bias}));
    seeds.emplace_back("valid-middle-dim-blocks", w.shard({o_proj,
                                                           {kExperts, block({0, 0, 0}, {2, 1, 4})},
                                                           {kExperts, block({0, 1, 0}, {2, 3, 4})},
                                                           bias}));
    const std::string file_a = w.shard({{kOProj, block({0, 0}, {6, 2})}, experts});
    const std::string file_b = w.shard({{kOProj, block({0, 2}, {6, 4})}, bias});
    seeds.emplace_back("valid-two-files", two_files(file_a, file_b));
    seeds.emplace_back("valid-two-files-swapped", two_files(file_b, file_a));
    seeds.emplace_back("valid-single-process",
                       w.single_process({{kOProj, {6, 4}},
                                         {"optimizer.m." + kOProj, {6, 4}},
                                         {"optimizer.v." + kOProj, {6, 4}},
                                         {kExperts, {2, 3, 4}},
                                         {"optimizer.m." + kExperts, {2, 3, 4}},
                                         {"optimizer.v." + kExperts, {2, 3, 4}},
                                         {kBias, {5}}}));

    // Pieces that do not tile.
    seeds.emplace_back("invalid-overlap",
                       w.shard({{kOProj, {}, 0, 13}, {kOProj, {}, 12, 24}, experts, bias}));
    seeds.emplace_back("invalid-gap",
                       w.shard({{kOProj, {}, 0, 11}, {kOProj, {}, 12, 24}, experts, bias}));
    seeds.emplace_back(
        "invalid-overlapping-blocks",
        w.shard({{kOProj, block({0, 0}, {6, 3})}, {kOProj, block({0, 2}, {6, 4})}, experts, bias}));
    seeds.emplace_back("invalid-overlap-across-files", two_files(whole, file_b));
    seeds.emplace_back("invalid-missing-file", file_a);
    seeds.emplace_back("invalid-missing-tensor", w.shard({o_proj, bias}));
    seeds.emplace_back(
        "invalid-missing-moment",
        w.shard({o_proj, experts, bias}, {CheckpointPart::param, CheckpointPart::m}));
    seeds.emplace_back(
        "invalid-single-process-unknown",
        w.single_process({{kOProj, {6, 4}}, {kExperts, {2, 3, 4}}, {"layers.9.x", {5}}}));
    seeds.emplace_back("invalid-single-process-shape", w.single_process({{kOProj, {4, 6}}}));

    // Edits of the slices of the whole checkpoint.
    const std::string name = kOProj;  // o_proj's param array is named as the tensor
    const auto set = [&](const std::string& seed_name, const std::string& key, json value) {
        seeds.emplace_back(seed_name, edit(whole, [&](json& s) { s[name][key] = value; }));
    };
    set("invalid-block-outside", "block", json::parse("[[0, 6], [2, 5]]"));
    set("invalid-block-negative", "block", json::parse("[[-1, 5], [0, 4]]"));
    set("invalid-block-empty-range", "block", json::parse("[[3, 3], [0, 4]]"));
    set("invalid-block-rank", "block", json::parse("[[0, 6]]"));
    set("invalid-block-not-pairs", "block", json::parse("[[0, 6, 1], [0, 4]]"));
    set("invalid-block-not-list", "block", json::parse("7"));
    set("invalid-block-huge", "block", json::parse("[[0, 9223372036854775807], [0, 4]]"));
    set("invalid-wrong-size", "flat", json::parse("[0, 23]"));
    set("invalid-flat-negative", "flat", json::parse("[-1, 23]"));
    set("invalid-flat-huge", "flat", json::parse("[0, 9223372036854775807]"));
    set("invalid-flat-unsigned", "flat", json::parse("[0, 18446744073709551615]"));
    set("invalid-flat-float-huge", "flat", json::parse("[0, 1e300]"));
    set("invalid-flat-one-number", "flat", json::parse("[24]"));
    set("invalid-flat-string", "flat", json::parse("\"0:24\""));
    set("invalid-unknown-tensor", "tensor", "layers.9.attn.o_proj");
    set("invalid-unknown-part", "part", "optimizer.w");
    set("invalid-wrong-shape", "shape", json::parse("[4, 6]"));
    set("invalid-shape-huge", "shape", json::parse("[4611686018427387904, 4]"));
    set("invalid-shape-float-huge", "shape", json::parse("[1e300, 4]"));
    set("invalid-shape-negative", "shape", json::parse("[-6, -4]"));
    for (const char* key : {"tensor", "part", "shape", "flat"})
        seeds.emplace_back(std::string("invalid-missing-key-") + key,
                           edit(whole, [&](json& s) { s[name].erase(key); }));
    seeds.emplace_back("invalid-slice-not-object", edit(whole, [&](json& s) {
                           s[name] = json::array({1, 2});
                       }));
    seeds.emplace_back("invalid-extra-slice", edit(whole, [&](json& s) { s["ghost"] = s[name]; }));
    seeds.emplace_back("invalid-array-without-slice", edit(whole, [&](json& s) {
                           s["ghost"] = s[name];
                           s.erase(name);
                       }));
    seeds.emplace_back("invalid-dtype", edit(
                                            whole, [](json&) {},
                                            [&](json& header) { header[name]["dtype"] = "I32"; }));
    seeds.emplace_back("invalid-bad-json", with_slices_text(whole, "{\"layers.0.attn.o_proj\": {"));
    seeds.emplace_back("invalid-slices-not-object", with_slices_text(whole, "[]"));

    // Layouts the fuzzer writes itself (check_checkpoint_layout): each byte a choice.
    const auto layout = [](std::vector<uint8_t> choices) {
        return std::string(1, static_cast<char>(kLayoutMark)) +
               std::string(choices.begin(), choices.end());
    };
    seeds.emplace_back("layout-whole", layout({}));
    seeds.emplace_back("layout-rows-and-ranges", layout({0, 2, 2, 4, 1, 5, 1, 1, 7, 0, 2, 3}));
    seeds.emplace_back("layout-columns-two-files",
                       layout({1, 1, 2, 1, 0, 1, 1, 2, 1, 3, 0, 1, 1, 1, 2, 3, 1, 2, 5}));
    seeds.emplace_back("layout-experts-bias-moments",
                       layout({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 0, 2, 1, 7, 1,
                               1, 2, 1, 2, 9, 0, 1, 0, 1, 0, 1, 0, 1, 2, 1, 2, 1, 1, 1, 1}));
    std::vector<uint8_t> every(200);
    for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<uint8_t>(i * 37 + 11);
    seeds.emplace_back("layout-many-pieces", layout(every));

    fs::create_directories(corpus);
    for (const auto& [seed_name, bytes] : seeds) {
        MT_CHECK(bytes.size() < 4096, "[corpus] seed {} is {} bytes", seed_name, bytes.size());
        std::ofstream(corpus / seed_name, std::ios::binary) << bytes;
    }
    fs::remove_all(scratch);
    std::printf("wrote %zu seeds to %s\n", seeds.size(), corpus.c_str());
    return 0;
}

}  // namespace
}  // namespace moetron::fuzz

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    try {
        return moetron::fuzz::run(argv[1]);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}

// checkpoint/safetensors and checkpoint/checksum: round trips, the exact bytes of the format,
// hostile files (each a moetron::Error naming the file, the tensor and the problem), and a replay
// of the fuzzer's corpus (tests/fuzz/corpus/safetensors) through the fuzzer's own property check.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "expect_contains.h"
#include "fuzz/safetensors_check.h"
#include "moetron/checkpoint/checksum.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"

namespace moetron {
namespace {

namespace fs = std::filesystem;

std::string error_of(const auto& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

std::string read_whole(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_whole(const std::string& path, std::string_view bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << path;
}

// A safetensors file from its parts: the length prefix says header_length (default: the true one).
std::string file_bytes(std::string_view header, std::string_view data,
                       std::optional<uint64_t> header_length = std::nullopt) {
    const uint64_t n = header_length.value_or(header.size());
    std::string bytes(reinterpret_cast<const char*>(&n), 8);
    bytes.append(header);
    bytes.append(data);
    return bytes;
}

class Safetensors : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("moetron_safetensors_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const char* name) const { return (dir_ / name).string(); }

    // Writes a hand-made file and returns the error opening it gives.
    std::string open_error(std::string_view header, std::string_view data,
                           std::optional<uint64_t> header_length = std::nullopt) {
        const std::string p = path("hostile.safetensors");
        write_whole(p, file_bytes(header, data, header_length));
        const std::string error = error_of([&] { SafetensorsFile::open(p); });
        EXPECT_CONTAINS(error, p);
        EXPECT_CONTAINS(error, "[");  // an [area] prefix
        return error;
    }

    fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
    const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
    const std::vector<bf16> b16 = {bf16(1.0f), bf16(-0.5f), bf16(3.0f), bf16(1e9f)};
    const std::vector<double> f64 = {3.141592653589793, -1e300};
    const std::vector<int32_t> i32 = {-1, 0, 2147483647};
    const std::vector<int64_t> i64 = {-9223372036854775807LL, 42};
    const std::vector<uint8_t> u8 = {0, 1, 255, 7, 9};
    const float scalar = 42.0f;
    SafetensorsWriter writer;
    writer.add("layers.0.w", DType::f32, {2, 3}, f32.data());
    writer.add("b16", DType::bf16, {4}, b16.data());
    writer.add("f64", DType::f64, {1, 1, 2}, f64.data());
    writer.add("i32", DType::i32, {3}, i32.data());
    writer.add("i64", DType::i64, {2, 1}, i64.data());
    writer.add("u8", DType::u8, {5}, u8.data());
    writer.add("empty", DType::f32, {0, 4}, nullptr);
    writer.add("scalar", DType::f32, {}, &scalar);
    writer.set_metadata("format", "pt");
    writer.set_metadata("step", "1200");
    const std::string p = path("all.safetensors");
    const FileDigest digest = writer.write(p);

    const std::string bytes = read_whole(p);
    EXPECT_EQ(digest.num_bytes, bytes.size());
    EXPECT_EQ(digest.xxh3, xxh3_64(bytes.data(), bytes.size()));
    EXPECT_EQ(digest, digest_file(p));

    const SafetensorsFile file = SafetensorsFile::open(p);
    EXPECT_EQ(file.data_offset() % 8, 0u);
    EXPECT_EQ(file.tensors().size(), 8u);
    EXPECT_EQ(file.metadata().at("step"), "1200");
    EXPECT_EQ(file.metadata().at("format"), "pt");
    for (size_t i = 1; i < file.tensors().size(); ++i)
        EXPECT_LE(file.tensors()[i - 1].end, file.tensors()[i].begin);

    std::vector<float> f32_back(6);
    file.read("layers.0.w", TensorView(f32_back.data(), {2, 3}, DType::f32));
    EXPECT_EQ(f32_back, f32);
    std::vector<bf16> b16_back(4);
    file.read("b16", TensorView(b16_back.data(), {4}, DType::bf16));
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b16_back[i].bits, b16[i].bits);
    std::vector<double> f64_back(2);
    file.read("f64", TensorView(f64_back.data(), {1, 1, 2}, DType::f64));
    EXPECT_EQ(f64_back, f64);
    std::vector<int32_t> i32_back(3);
    file.read("i32", TensorView(i32_back.data(), {3}, DType::i32));
    EXPECT_EQ(i32_back, i32);
    std::vector<int64_t> i64_back(2);
    file.read("i64", TensorView(i64_back.data(), {2, 1}, DType::i64));
    EXPECT_EQ(i64_back, i64);
    std::vector<uint8_t> u8_back(5);
    file.read("u8", TensorView(u8_back.data(), {5}, DType::u8));
    EXPECT_EQ(u8_back, u8);
    file.read("empty", TensorView(nullptr, {0, 4}, DType::f32));
    float scalar_back = 0;
    file.read("scalar", DType::f32, {}, &scalar_back, sizeof scalar_back);
    EXPECT_EQ(scalar_back, 42.0f);
    EXPECT_EQ(file.entry("f64").shape(), (Shape{1, 1, 2}));
}

// The exact bytes, so files interoperate with other safetensors readers and writers.
TEST_F(Safetensors, WritesTheReferenceLayout) {
    const float values[2] = {1.0f, 2.0f};
    SafetensorsWriter writer;
    writer.add("w", DType::f32, {2}, values);
    writer.set_metadata("k", "v");
    const std::string header =
        R"({"__metadata__":{"k":"v"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
    EXPECT_EQ(writer.header_text(), padded);
    const std::string p = path("ref.safetensors");
    writer.write(p);
    EXPECT_EQ(read_whole(p),
              file_bytes(padded, std::string_view(reinterpret_cast<const char*>(values), 8)));
}

// A file as the Python library writes it (no metadata, keys in another order, unpadded).
TEST_F(Safetensors, ReadsAForeignFile) {
    const int32_t data[3] = {7, 8, 9};
    const std::string p = path("foreign.safetensors");
    write_whole(p, file_bytes(R"({"b":{"data_offsets":[4,12],"shape":[2],"dtype":"I32"},)"
                              R"("a":{"shape":[],"dtype":"I32","data_offsets":[0,4]}})",
                              std::string_view(reinterpret_cast<const char*>(data), 12)));
    const SafetensorsFile file = SafetensorsFile::open(p);
    ASSERT_EQ(file.tensors().size(), 2u);
    EXPECT_EQ(file.tensors()[0].name, "a");
    int32_t b[2] = {};
    file.read("b", DType::i32, std::vector<int64_t>{2}, b, sizeof b);
    EXPECT_EQ(b[0], 8);
    EXPECT_EQ(b[1], 9);
    EXPECT_TRUE(file.metadata().empty());
}

TEST_F(Safetensors, ReadChecksExpectedDtypeShapeAndSize) {
    std::vector<float> w(6, 1.0f);
    SafetensorsWriter writer;
    writer.add("w", DType::f32, {2, 3}, w.data());
    const std::string p = path("w.safetensors");
    writer.write(p);
    const SafetensorsFile file = SafetensorsFile::open(p);
    std::vector<float> out(6);
    std::string e = error_of([&] { file.read("w", TensorView(out.data(), {3, 2}, DType::f32)); });
    EXPECT_CONTAINS(e, "tensor 'w' has shape (2, 3) in the file, expected (3, 2)");
    EXPECT_CONTAINS(e, p);
    e = error_of([&] { file.read("w", TensorView(out.data(), {2, 3}, DType::i32)); });
    EXPECT_CONTAINS(e, "tensor 'w' is F32 in the file, expected I32");
    e = error_of([&] { file.read("w", DType::f32, std::vector<int64_t>{2, 3}, out.data(), 20); });
    EXPECT_CONTAINS(e, "24 bytes, the destination 20 bytes");
    e = error_of([&] { file.read("nope", TensorView(out.data(), {6}, DType::f32)); });
    EXPECT_CONTAINS(e, "has no tensor 'nope'");
    EXPECT_EQ(file.find("nope"), nullptr);
}

TEST_F(Safetensors, WriterRejectsBadTensors) {
    const float x = 0;
    SafetensorsWriter writer;
    writer.add("a", DType::f32, {}, &x);
    EXPECT_CONTAINS(error_of([&] { writer.add("a", DType::f32, {}, &x); }), "added twice");
    EXPECT_CONTAINS(error_of([&] { writer.add("__metadata__", DType::f32, {}, &x); }), "reserved");
    EXPECT_CONTAINS(error_of([&] {
                        writer.add("n", DType::f32, {2, -1}, &x);
                    }),
                    "negative dimension");
    EXPECT_CONTAINS(error_of([&] {
                        writer.add("o", DType::f64, {1LL << 40, 1LL << 40}, &x);
                    }),
                    "overflows");
    EXPECT_CONTAINS(error_of([&] { writer.add("z", DType::f32, {3}, nullptr); }), "null data");
    writer.add("bad\xff", DType::f32, {}, &x);  // not UTF-8: caught when the header is built
    EXPECT_CONTAINS(error_of([&] { writer.write(path("bad.safetensors")); }), "cannot be written");
}

TEST_F(Safetensors, WriterReportsIoErrors) {
    const float x = 0;
    SafetensorsWriter writer;
    writer.add("a", DType::f32, {}, &x);
    const std::string p = path("no/such/dir/file.safetensors");
    const std::string e = error_of([&] { writer.write(p); });
    EXPECT_CONTAINS(e, "cannot create");
    EXPECT_CONTAINS(e, p);
}

// ---- hostile files ----

constexpr std::string_view kEightBytes = "01234567";

TEST_F(Safetensors, MissingEmptyAndShortFiles) {
    std::string e = error_of([&] { SafetensorsFile::open(path("missing.safetensors")); });
    EXPECT_CONTAINS(e, "missing.safetensors' does not exist");
    write_whole(path("empty.safetensors"), "");
    e = error_of([&] { SafetensorsFile::open(path("empty.safetensors")); });
    EXPECT_CONTAINS(e, "empty.safetensors' is 0 bytes: too short");
    write_whole(path("short.safetensors"), "abc");
    e = error_of([&] { SafetensorsFile::open(path("short.safetensors")); });
    EXPECT_CONTAINS(e, "is 3 bytes: too short");
    e = error_of([&] { SafetensorsFile::open(dir_.string()); });
    EXPECT_CONTAINS(e, "is a directory");
}

TEST_F(Safetensors, HeaderLengthPastTheEndOrHuge) {
    const std::string header = R"({"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})";
    EXPECT_CONTAINS(open_error(header, kEightBytes, header.size() + 9),
                    "reaches past the end of the");
    EXPECT_CONTAINS(open_error(header, kEightBytes, uint64_t{1} << 62), "over the format's limit");
    EXPECT_CONTAINS(open_error(header, kEightBytes, UINT64_MAX), "over the format's limit");
}

TEST_F(Safetensors, TruncatedFile) {
    std::vector<float> w(64, 2.0f);
    SafetensorsWriter writer;
    writer.add("first", DType::f32, {32}, w.data());
    writer.add("last", DType::f32, {32}, w.data() + 32);
    const std::string p = path("t.safetensors");
    writer.write(p);
    const std::string whole = read_whole(p);
    for (size_t keep : {whole.size() - 1, whole.size() - 128, size_t{40}, size_t{7}}) {
        write_whole(p, whole.substr(0, keep));
        const std::string e = error_of([&] { SafetensorsFile::open(p); });
        EXPECT_CONTAINS(e, p);
        if (keep > whole.size() - 128) {
            EXPECT_CONTAINS(e, "tensor 'last': data_offsets [128, 256] reach past the end");
        } else if (keep == whole.size() - 128) {
            EXPECT_CONTAINS(e, "tensor 'last'");
        } else if (keep >= 8) {
            EXPECT_CONTAINS(e, "reaches past the end");
        } else {
            EXPECT_CONTAINS(e, "too short");
        }
    }
}

TEST_F(Safetensors, TruncatedAfterOpening) {
    std::vector<float> w(16, 1.0f);
    SafetensorsWriter writer;
    writer.add("w", DType::f32, {16}, w.data());
    const std::string p = path("shrink.safetensors");
    writer.write(p);
    const SafetensorsFile file = SafetensorsFile::open(p);
    fs::resize_file(p, fs::file_size(p) - 4);
    const std::string e = error_of([&] { file.read("w", TensorView(w.data(), {16}, DType::f32)); });
    EXPECT_CONTAINS(e, "the file ends inside tensor 'w'");
}

TEST_F(Safetensors, OffsetsOverlapGapTrailingReversedOrPastTheEnd) {
    EXPECT_CONTAINS(open_error(R"({"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},)"
                               R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                               kEightBytes),
                    "tensor 'b' [4, 8) overlaps tensor 'a' [0, 6)");
    EXPECT_CONTAINS(open_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                               R"("b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
                               kEightBytes),
                    "overlaps tensor 'a'");
    EXPECT_CONTAINS(open_error(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                               R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                               kEightBytes),
                    "bytes [2, 4) of the data buffer belong to no tensor (before tensor 'b')");
    EXPECT_CONTAINS(
        open_error(R"({"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]}})", kEightBytes),
        "2 bytes after the last tensor 'a' ends");
    EXPECT_CONTAINS(open_error("{}", kEightBytes), "8 bytes after the last tensor ends");
    EXPECT_CONTAINS(
        open_error(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", kEightBytes),
        "tensor 'a': data_offsets [8, 0] end before they begin");
    EXPECT_CONTAINS(
        open_error(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", kEightBytes),
        "tensor 'a': data_offsets [0, 16] reach past the end of the data buffer (8 bytes");
    EXPECT_CONTAINS(open_error(R"({"a":{"dtype":"U8","shape":[0],)"
                               R"("data_offsets":[18446744073709551615,18446744073709551615]}})",
                               ""),
                    "reach past the end");
}

TEST_F(Safetensors, DtypeAndShapeProblems) {
    EXPECT_CONTAINS(
        open_error(R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", kEightBytes),
        "tensor 'h': unsupported dtype 'F16'");
    EXPECT_CONTAINS(
        open_error(R"({"h":{"dtype":7,"shape":[4],"data_offsets":[0,8]}})", kEightBytes),
        "tensor 'h': dtype is a JSON number, not a string");
    EXPECT_CONTAINS(
        open_error(R"({"s":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", kEightBytes),
        "tensor 's': shape (3,) of F32 is 12 bytes but data_offsets [0, 8] hold 8 bytes");
    EXPECT_CONTAINS(
        open_error(R"({"n":{"dtype":"U8","shape":[-8],"data_offsets":[0,8]}})", kEightBytes),
        "tensor 'n': shape '[-8]' has the dimension '-8', not a non-negative integer");
    EXPECT_CONTAINS(
        open_error(R"({"f":{"dtype":"U8","shape":[8.0],"data_offsets":[0,8]}})", kEightBytes),
        "not a non-negative integer");
    EXPECT_CONTAINS(open_error(R"({"o":{"dtype":"F32","shape":[4611686018427387904,4],)"
                               R"("data_offsets":[0,8]}})",
                               kEightBytes),
                    "tensor 'o': shape (4611686018427387904, 4) of F32 overflows");
    // Wraps to exactly 8 bytes in 64-bit arithmetic: only an overflow check catches it.
    EXPECT_CONTAINS(open_error(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,8],)"
                               R"("data_offsets":[0,8]}})",
                               kEightBytes),
                    "overflows");
    // Empty, but Shape::numel() would still overflow multiplying the other dimensions first.
    EXPECT_CONTAINS(open_error(R"({"z":{"dtype":"U8","shape":[4294967296,4294967296,0],)"
                               R"("data_offsets":[0,0]}})",
                               ""),
                    "overflows");
    EXPECT_CONTAINS(open_error(R"({"d":{"dtype":"U8","shape":[9223372036854775808],)"
                               R"("data_offsets":[0,8]}})",
                               kEightBytes),
                    "not a non-negative integer");
    EXPECT_CONTAINS(
        open_error(R"({"x":{"dtype":"U8","shape":8,"data_offsets":[0,8]}})", kEightBytes),
        "tensor 'x': shape is a JSON number, not an array");
}

TEST_F(Safetensors, MalformedEntries) {
    EXPECT_CONTAINS(open_error(R"({"m":{"dtype":"U8","shape":[8]}})", kEightBytes),
                    "tensor 'm': missing key 'data_offsets'");
    EXPECT_CONTAINS(open_error(R"({"m":{"dtype":"U8","shape":[8],"data_offsets":[0,8],"extra":1}})",
                               kEightBytes),
                    "tensor 'm': unexpected key 'extra'");
    EXPECT_CONTAINS(open_error(R"({"m":[1,2]})", kEightBytes),
                    "tensor 'm': its entry is a JSON array, not an object");
    EXPECT_CONTAINS(
        open_error(R"({"m":{"dtype":"U8","shape":[8],"data_offsets":[0,4,8]}})", kEightBytes),
        "tensor 'm': data_offsets is '[0,4,8]', not an array [begin, end]");
    EXPECT_CONTAINS(
        open_error(R"({"m":{"dtype":"U8","shape":[8],"data_offsets":[0,"8"]}})", kEightBytes),
        "are not non-negative integers");
    EXPECT_CONTAINS(open_error(R"({"__metadata__":{"k":1}})", ""),
                    "__metadata__ entry 'k' is a JSON number, not a string");
    EXPECT_CONTAINS(open_error(R"({"__metadata__":[]})", ""), "__metadata__ is a JSON array");
}

TEST_F(Safetensors, NotJsonOrNotAnObject) {
    EXPECT_CONTAINS(open_error("[1, 2]", ""), "the header is a JSON array, not an object");
    EXPECT_CONTAINS(open_error(R"("text")", ""), "the header is a JSON string, not an object");
    EXPECT_CONTAINS(open_error("{", ""), "the header is not valid JSON");
    EXPECT_CONTAINS(open_error("", ""), "the header is not valid JSON");
    EXPECT_CONTAINS(open_error("{\"\xff\":1}", ""), "the header is not valid JSON");
    EXPECT_CONTAINS(open_error("{} x", ""), "the header is not valid JSON");
    EXPECT_CONTAINS(open_error(std::string(100000, '['), ""), "nests JSON deeper");
    EXPECT_CONTAINS(open_error(R"({"a":{"dtype":[[1]]}})", ""), "nests JSON deeper");
}

TEST_F(Safetensors, RepeatedKeys) {
    EXPECT_CONTAINS(open_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                               R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                               kEightBytes),
                    "the header repeats the key 'a'");
    EXPECT_CONTAINS(
        open_error(R"({"a":{"dtype":"U8","dtype":"F32","shape":[8],"data_offsets":[0,8]}})",
                   kEightBytes),
        "repeats the key 'dtype'");
}

TEST_F(Safetensors, HostileNamesAreEscapedAndCut) {
    const std::string name = "evil\\u0001" + std::string(1000, 'x');
    const std::string e = open_error(
        R"({")" + name + R"(":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", kEightBytes);
    EXPECT_CONTAINS(e, "tensor 'evil\\x01xxx");
    EXPECT_CONTAINS(e, "(cut, 1005 bytes in all)");
    EXPECT_LT(e.size(), 600u);
}

// Every single-bit flip in the header is rejected or still describes a consistent file; none
// crashes. A flipped data byte (or a flip the parser cannot see, in a name) is the checksum's job.
TEST_F(Safetensors, BitFlipsInHeaderAndData) {
    std::vector<float> w(4, 1.0f);
    const int64_t ids[2] = {3, 4};
    SafetensorsWriter writer;
    writer.add("w", DType::f32, {2, 2}, w.data());
    writer.add("ids", DType::i64, {2}, ids);
    writer.set_metadata("k", "v");
    const std::string p = path("flip.safetensors");
    const FileDigest digest = writer.write(p);
    const std::string whole = read_whole(p);
    const size_t data_offset = SafetensorsFile::open(p).data_offset();
    int rejected = 0, accepted = 0;
    for (size_t byte = 0; byte < data_offset; ++byte) {
        for (int bit = 0; bit < 8; ++bit) {
            std::string flipped = whole;
            flipped[byte] = static_cast<char>(flipped[byte] ^ (1 << bit));
            const bool valid = fuzz::check_safetensors_bytes(
                reinterpret_cast<const uint8_t*>(flipped.data()), flipped.size());
            (valid ? accepted : rejected) += 1;
            EXPECT_NE(xxh3_64(flipped.data(), flipped.size()), digest.xxh3);
        }
    }
    std::printf("[flips] header bit flips: %d rejected, %d still valid\n", rejected, accepted);
    EXPECT_GT(rejected, 8 * static_cast<int>(data_offset) * 3 / 4);

    std::string flipped = whole;
    flipped[data_offset + 5] ^= 0x10;
    write_whole(p, flipped);
    EXPECT_NO_THROW(SafetensorsFile::open(p));  // structurally fine: only the checksum sees it
    CheckpointIndex index;
    index.add("flip.safetensors", digest);
    const std::string e = error_of([&] { index.verify(dir_.string()); });
    EXPECT_CONTAINS(e, "flip.safetensors' is corrupt: its xxh3 checksum is");
}

// ---- checksums ----

TEST(Checksum, KnownValueAndStreamingEqualsOneShot) {
    EXPECT_EQ(xxh3_64(nullptr, 0), 0x2D06800538D394C2ULL);  // XXH3-64 of "", from xxHash's tests
    Xxh3Hasher empty;
    EXPECT_EQ(empty.digest(), 0x2D06800538D394C2ULL);
    std::vector<uint8_t> data(1 << 20);
    for (size_t i = 0; i < data.size(); ++i)
        data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    const uint64_t one_shot = xxh3_64(data.data(), data.size());
    for (size_t piece : {1, 7, 64, 255, 256, 1000, 4096, 65537}) {
        Xxh3Hasher hasher;
        for (size_t at = 0; at < data.size(); at += piece)
            hasher.update(data.data() + at, std::min(piece, data.size() - at));
        EXPECT_EQ(hasher.digest(), one_shot) << "piece " << piece;
    }
    data[123456] ^= 1;
    EXPECT_NE(xxh3_64(data.data(), data.size()), one_shot);
}

TEST(Checksum, HexRoundTrip) {
    EXPECT_EQ(xxh3_hex(0x2D06800538D394C2ULL), "2d06800538d394c2");
    EXPECT_EQ(xxh3_hex(1), "0000000000000001");
    EXPECT_EQ(parse_xxh3_hex("2d06800538d394c2"), 0x2D06800538D394C2ULL);
    EXPECT_EQ(parse_xxh3_hex("2D06800538D394C2"), 0x2D06800538D394C2ULL);
    EXPECT_EQ(parse_xxh3_hex("2d06800538d394c"), std::nullopt);
    EXPECT_EQ(parse_xxh3_hex("2d06800538d394c2 "), std::nullopt);
    EXPECT_EQ(parse_xxh3_hex("-d06800538d394c2"), std::nullopt);
    EXPECT_EQ(parse_xxh3_hex("2d06800538d394cg"), std::nullopt);
}

// ---- the fuzzer's corpus, replayed through the fuzzer's property ----

TEST(SafetensorsCorpus, ReplaysThroughTheFuzzerProperty) {
    const fs::path corpus = fs::path(MOETRON_SOURCE_DIR) / "tests/fuzz/corpus/safetensors";
    ASSERT_TRUE(fs::is_directory(corpus)) << corpus;
    int num_files = 0, num_valid_files = 0, num_valid_headers = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(corpus)) {
        const std::string bytes = read_whole(entry.path().string());
        const fuzz::FormsValid valid =
            fuzz::check_both_forms(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        const std::string name = entry.path().filename().string();
        // Hand-made seeds say what they are; inputs the fuzzer found may be anything.
        if (name.starts_with("valid-")) {
            EXPECT_TRUE(valid.as_file) << name;
        } else if (name.starts_with("invalid-")) {
            EXPECT_FALSE(valid.as_file) << name;
        } else if (name.starts_with("json-valid-")) {
            EXPECT_TRUE(valid.as_header_and_data) << name;
        } else if (name.starts_with("json-invalid-")) {
            EXPECT_FALSE(valid.as_header_and_data) << name;
        }
        num_valid_files += valid.as_file;
        num_valid_headers += valid.as_header_and_data;
        ++num_files;
    }
    std::printf("[corpus] %d inputs: %d valid as files, %d valid as header + data\n", num_files,
                num_valid_files, num_valid_headers);
    EXPECT_GE(num_valid_files, 3);
    EXPECT_GE(num_files - num_valid_files, 10);
}

}  // namespace
}  // namespace moetron

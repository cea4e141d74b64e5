#include "moetron/model/pipeline_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "moetron/core/user_error.h"

namespace moetron {

namespace {

// Expands "(...)*n" and "x*n" repetitions of a pipeline layout string.
std::string expand_layout(std::string_view text, std::string_view whole) {
    std::string out;
    size_t i = 0;
    auto read_count = [&](size_t& pos) {
        MT_USER_CHECK(pos < text.size() && text[pos] == '*',
                      "[pp-layout] pipeline layout '{}': expected *n", whole);
        ++pos;
        int64_t n = 0;
        auto [end, ec] = std::from_chars(text.data() + pos, text.data() + text.size(), n);
        MT_USER_CHECK(ec == std::errc() && n >= 1,
                      "[pp-layout] pipeline layout '{}': '*' needs a positive count", whole);
        pos = static_cast<size_t>(end - text.data());
        return n;
    };
    while (i < text.size()) {
        const char c = text[i];
        if (c == '(') {
            int depth = 1;
            size_t j = i + 1;
            while (j < text.size() && depth > 0) {
                depth += text[j] == '(' ? 1 : text[j] == ')' ? -1 : 0;
                ++j;
            }
            MT_USER_CHECK(depth == 0, "[pp-layout] pipeline layout '{}': unbalanced parentheses",
                          whole);
            const std::string inner = expand_layout(text.substr(i + 1, j - i - 2), whole);
            i = j;
            const int64_t n = (i < text.size() && text[i] == '*') ? read_count(i) : 1;
            for (int64_t k = 0; k < n; ++k) out += inner;
        } else if (c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|') {
            ++i;
            const int64_t n = (i < text.size() && text[i] == '*') ? read_count(i) : 1;
            out.append(static_cast<size_t>(n), c);
        } else {
            MT_USER_THROW(
                "[pp-layout] pipeline layout '{}': unknown symbol '{}' (known: E t m L | ( ) *n)",
                whole, c);
        }
    }
    return out;
}

// "Ettt" -> "Et*3": runs of one symbol written with a count.
std::string compress_chunk(const std::string& blocks) {
    std::string out;
    for (size_t i = 0; i < blocks.size();) {
        size_t j = i;
        while (j < blocks.size() && blocks[j] == blocks[i]) ++j;
        out += blocks[i];
        if (j - i > 1) out += fmt::format("*{}", j - i);
        i = j;
    }
    return out;
}

}  // namespace

std::vector<std::string> parse_pipeline_layout(std::string_view text) {
    const std::string flat = expand_layout(text, text);
    std::vector<std::string> chunks(1);
    for (char c : flat) {
        if (c == '|') {
            chunks.emplace_back();
        } else {
            chunks.back() += c;
        }
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
        MT_USER_CHECK(!chunks[i].empty(), "[pp-layout] pipeline layout '{}': chunk {} is empty",
                      text, i);
    }
    return chunks;
}

std::vector<PipelineChunk> pipeline_chunks(const ModelConfig& model, std::string_view text,
                                           int64_t num_chunks, int64_t mtp_modules) {
    const std::vector<std::string> parsed = parse_pipeline_layout(text);
    const auto count = static_cast<int64_t>(parsed.size());
    MT_USER_CHECK(count == num_chunks,
                  "[pp-layout] pipeline layout '{}' has {} chunks but pp*vpp = {}", text, count,
                  num_chunks);
    std::vector<PipelineChunk> out(parsed.size());
    int64_t layers = 0, mtp = 0, embeddings = 0, heads = 0;
    for (int64_t g = 0; g < count; ++g) {
        PipelineChunk& chunk = out[static_cast<size_t>(g)];
        chunk.first_layer = layers;
        chunk.first_mtp = mtp;
        for (char c : parsed[static_cast<size_t>(g)]) {
            if (c == 'E') {
                MT_USER_CHECK(g == 0,
                              "[pp-layout] pipeline layout '{}' places the embedding (E) in chunk "
                              "{}; it must be in the first chunk, where the tokens enter",
                              text, g);
                chunk.embedding = true;
                ++embeddings;
            } else if (c == 'L') {
                MT_USER_CHECK(g + 1 == count,
                              "[pp-layout] pipeline layout '{}' places the loss (L) in chunk {}; "
                              "it must be in the last chunk ({})",
                              text, g, count - 1);
                chunk.loss = true;
                ++heads;
            } else if (c == 't') {
                MT_USER_CHECK(mtp == 0,
                              "[pp-layout] pipeline layout '{}' places a transformer layer after "
                              "an MTP module; the MTP modules follow the main model's last layer",
                              text);
                MT_USER_CHECK(layers < model.num_hidden_layers,
                              "[pp-layout] pipeline layout '{}' has more than the {} layers of "
                              "model '{}'",
                              text, model.num_hidden_layers, model.name);
                ++chunk.num_layers;
                ++layers;
            } else if (c == 'm') {
                MT_USER_CHECK(g + 1 == count,
                              "[pp-layout] pipeline layout '{}' places an MTP module (m) in chunk "
                              "{}; the MTP modules go in the last chunk, with the head they share",
                              text, g);
                MT_USER_CHECK(mtp < mtp_modules,
                              "[pp-layout] pipeline layout '{}' places more MTP modules (m) than "
                              "the {} that run (the model's num_nextn_predict_layers, or none "
                              "when MTP is off)",
                              text, mtp_modules);
                ++chunk.num_mtp;
                ++mtp;
            }
        }
    }
    MT_USER_CHECK(layers == model.num_hidden_layers,
                  "[pp-layout] pipeline layout '{}' places {} layers, model '{}' has {}", text,
                  layers, model.name, model.num_hidden_layers);
    MT_USER_CHECK(embeddings == 1 && heads == 1,
                  "[pp-layout] pipeline layout '{}' needs exactly one E and one L", text);
    MT_USER_CHECK(mtp == mtp_modules,
                  "[pp-layout] pipeline layout '{}' places {} MTP modules (m), expected {}", text,
                  mtp, mtp_modules);
    return out;
}

std::string default_pipeline_layout(const ModelConfig& model, int64_t num_chunks,
                                    int64_t mtp_modules) {
    MT_USER_CHECK(num_chunks >= 1, "[pp-layout] pp*vpp must be positive, got {}", num_chunks);
    std::string blocks = "E";
    blocks.append(static_cast<size_t>(model.num_hidden_layers), 't');
    blocks.append(static_cast<size_t>(mtp_modules), 'm');
    blocks += 'L';
    const auto total = static_cast<int64_t>(blocks.size());
    MT_USER_CHECK(total >= num_chunks,
                  "[pp-layout] pp*vpp = {} chunks for model '{}', which has only {} blocks "
                  "(embedding, {} layers, {} MTP modules, head); use fewer stages",
                  num_chunks, model.name, total, model.num_hidden_layers, mtp_modules);
    // The blocks left over after an even split go to the chunks after the first, so the chunk
    // holding the embedding, and the one holding the head unless every chunk but the first gets
    // one, carry the fewest.
    const int64_t base = total / num_chunks, extra = total % num_chunks;
    std::vector<int64_t> sizes(static_cast<size_t>(num_chunks));
    for (int64_t g = 0; g < num_chunks; ++g) sizes[g] = base + (g >= 1 && g <= extra ? 1 : 0);
    // The MTP modules stay with the head in the last chunk: it grows, the chunks before it give
    // up their last blocks.
    int64_t missing = mtp_modules + 1 - sizes.back();
    for (int64_t g = num_chunks - 2; g >= 0 && missing > 0; --g) {
        const int64_t give = std::min(missing, sizes[g] - 1);
        sizes[g] -= give;
        sizes.back() += give;
        missing -= give;
    }
    MT_USER_CHECK(missing <= 0,
                  "[pp-layout] pp*vpp = {} chunks for model '{}': with its {} MTP modules and the "
                  "head in the last chunk, some chunk would be empty; use fewer stages",
                  num_chunks, model.name, mtp_modules);
    std::string layout;
    int64_t begin = 0;
    for (int64_t g = 0; g < num_chunks; ++g) {
        const int64_t size = sizes[static_cast<size_t>(g)];
        if (g > 0) layout += '|';
        layout +=
            compress_chunk(blocks.substr(static_cast<size_t>(begin), static_cast<size_t>(size)));
        begin += size;
    }
    return layout;
}

}  // namespace moetron

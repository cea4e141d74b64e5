// moetron prepare: tokenize a text file byte-level into a moetron token shard (train/token_shard.h
// documents the format), for `moetron train --data`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/checkpoint/output_paths.h"
#include "moetron/cli/commands.h"
#include "moetron/core/error.h"
#include "moetron/train/data_source.h"
#include "moetron/train/token_shard.h"
#include "moetron/train/tokenizer.h"

namespace moetron::cli {

namespace {

struct PrepareOptions {
    std::string text_path;
    std::string out_path;
};

void run_prepare(const PrepareOptions& o) {
    const PathOption output{"--out", o.out_path};
    check_output_file(output);
    refuse_output_in_checkpoint(output);
    refuse_same_file(output, {{"--text", o.text_path}});
    const TokenData data = load_text_file_data(o.text_path, kByteVocabSize);
    write_token_shard(o.out_path, data.tokens.data(), static_cast<int64_t>(data.tokens.size()),
                      kByteVocabSize);
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(o.out_path, ec);
    MT_CHECK(!ec, "[prepare] cannot read back the size of '{}': {}", o.out_path, ec.message());
    std::printf("wrote %zu tokens (byte-level, vocab 256) from %s to %s (%llu bytes)\n",
                data.tokens.size(), o.text_path.c_str(), o.out_path.c_str(),
                static_cast<unsigned long long>(bytes));
    MT_CHECK(std::fflush(stdout) == 0, "[prepare] writing to stdout failed: {}",
             detail::errno_message());
}

}  // namespace

void register_prepare(CLI::App& app) {
    auto o = std::make_shared<PrepareOptions>();
    CLI::App* cmd =
        app.add_subcommand("prepare", "Tokenize a text file (byte-level) into a token shard");
    cmd->add_option("--text", o->text_path, "input text file")->required();
    cmd->add_option("--out", o->out_path,
                    "output token shard (written to a temporary name, then renamed into place)")
        ->required();
    cmd->callback([o] { run_prepare(*o); });
}

}  // namespace moetron::cli

#include "moetron/checkpoint/checkpoint_dir.h"

#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_pieces.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/checkpoint/checkpoint_sharded.h"
#include "moetron/checkpoint/checksum.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kStateFormat = "moetron-checkpoint";

std::vector<int64_t> dims_of(const ParamEntry& e) {
    return {e.shape.dims.begin(), e.shape.dims.begin() + e.shape.ndim};
}

void write_text_file(const fs::path& path, const std::string& text) {
    UniqueFd fd = create_for_writing(path.string());
    write_all(fd.get(), text.data(), text.size(), path.string());
    fsync_fd(fd.get(), path.string());
    fd.close(path.string());
}

std::string read_text_file(const fs::path& path, uint64_t max_bytes) {
    UniqueFd fd = open_for_reading(path.string());
    const uint64_t size = file_size_bytes(fd.get(), path.string());
    MT_CHECK(size <= max_bytes, "[checkpoint] '{}' is {} bytes, more than the {} it can be",
             path.string(), size, max_bytes);
    std::string text(size, '\0');
    MT_CHECK(read_at(fd.get(), text.data(), size, 0, path.string()) == size,
             "[checkpoint] '{}' shrank while it was read", path.string());
    return text;
}

template <class T>
T state_field(const json& state, const char* key, const fs::path& source) {
    MT_CHECK(state.contains(key), "[checkpoint] '{}' has no \"{}\"", source.string(), key);
    try {
        return state.at(key).get<T>();
    } catch (const json::exception& e) {
        MT_THROW("[checkpoint] '{}': \"{}\" has the wrong type ({}): {}", source.string(), key,
                 state.at(key).dump(), e.what());
    }
}

}  // namespace

// ---- configs ----

ModelConfig model_config_from_json(const json& j, const std::string& source) {
    MT_CHECK(j.is_object(), "[checkpoint] {}: the model config is not a JSON object", source);
    return parse_model_config_json(j.dump(), source);
}

json train_config_to_json(const TrainConfig& c) {
    return json{{"batch_size", c.batch_size},
                {"seq_len", c.seq_len},
                {"grad_accum", c.grad_accum},
                {"steps", c.steps},
                {"lr", c.lr},
                {"min_lr", c.min_lr},
                {"warmup_steps", c.warmup_steps},
                {"weight_decay", c.weight_decay},
                {"beta1", c.beta1},
                {"beta2", c.beta2},
                {"eps", c.eps},
                {"grad_clip", c.grad_clip},
                {"seed", c.seed},
                {"bias_update_speed", c.bias_update_speed},
                {"balance_loss_alpha", c.balance_loss_alpha},
                {"mtp_lambda", c.mtp_lambda},
                {"eval_every", c.eval_every},
                {"eval_batches", c.eval_batches},
                {"val_fraction", c.val_fraction}};
}

TrainConfig train_config_from_json(const json& j, const std::string& source) {
    MT_CHECK(j.is_object(), "[checkpoint] {}: the train config is not a JSON object", source);
    TrainConfig c;
    auto read = [&](const char* key, auto& field) {
        if (!j.contains(key)) return;  // an older checkpoint: the default
        try {
            j.at(key).get_to(field);
        } catch (const json::exception& e) {
            MT_THROW("[checkpoint] {}: train_config \"{}\" has the wrong type ({}): {}", source,
                     key, j.at(key).dump(), e.what());
        }
    };
    read("batch_size", c.batch_size);
    read("seq_len", c.seq_len);
    read("grad_accum", c.grad_accum);
    read("steps", c.steps);
    read("lr", c.lr);
    read("min_lr", c.min_lr);
    read("warmup_steps", c.warmup_steps);
    read("weight_decay", c.weight_decay);
    read("beta1", c.beta1);
    read("beta2", c.beta2);
    read("eps", c.eps);
    read("grad_clip", c.grad_clip);
    read("seed", c.seed);
    read("bias_update_speed", c.bias_update_speed);
    read("balance_loss_alpha", c.balance_loss_alpha);
    read("mtp_lambda", c.mtp_lambda);
    read("eval_every", c.eval_every);
    read("eval_batches", c.eval_batches);
    read("val_fraction", c.val_fraction);
    return c;
}

std::vector<std::string> model_config_differences(const ModelConfig& a, const ModelConfig& b) {
    const json ja = model_config_to_json(a), jb = model_config_to_json(b);
    std::vector<std::string> keys;
    for (const auto& [key, value] : ja.items())
        if (key != "name" && value != jb.at(key)) keys.push_back(key);
    return keys;
}

std::vector<std::string> train_config_differences(const fs::path& dir, const TrainConfig& config) {
    const fs::path path = dir / kCheckpointStateFile;
    json state;
    try {
        state = json::parse(read_text_file(path, kMaxCheckpointStateBytes));
    } catch (const json::exception& e) {
        MT_THROW("[checkpoint] '{}' is not valid JSON: {}", path.string(), e.what());
    }
    const json saved = state_field<json>(state, "train_config", path);
    std::vector<std::string> lines;
    const json current = train_config_to_json(config);  // named: items() must not dangle
    for (const auto& [key, now] : current.items()) {
        const json was = saved.contains(key) ? saved.at(key) : json(nullptr);
        if (was != now) lines.push_back(fmt::format("{}: {} -> {}", key, was.dump(), now.dump()));
    }
    return lines;
}

CheckpointRun read_checkpoint_run(const fs::path& dir_or_root) {
    CheckpointRun run;
    run.dir = resolve_checkpoint_dir(dir_or_root);
    const fs::path path = run.dir / kCheckpointStateFile;
    json state;
    try {
        state = json::parse(read_text_file(path, kMaxCheckpointStateBytes));
    } catch (const json::exception& e) {
        MT_THROW("[checkpoint] '{}' is not valid JSON: {}", path.string(), e.what());
    }
    run.model =
        model_config_from_json(state_field<json>(state, "model_config", path), path.string());
    run.train =
        train_config_from_json(state_field<json>(state, "train_config", path), path.string());
    run.data_source = state_field<std::string>(state, "data_source", path);
    run.step = state_field<int64_t>(state, "step", path);
    return run;
}

// ---- save ----

json training_state_json(const TrainingStateView& st) {
    json files = json::array();
    for (int r = 0; r < st.topology.world_size; ++r)
        files.push_back(checkpoint_shard_file_name(r, st.topology.world_size));
    json state{{"format", kStateFormat},
               {"version", kCheckpointVersion},
               {"run_id", st.run_id},
               {"layout", checkpoint_layout_name(st.topology)},
               {"world_size", st.topology.world_size},
               {"topology", st.topology.str()},
               {"shard_files", files},
               {"step", st.step},
               {"optimizer_step", st.optimizer_step},
               {"skipped_steps", st.skipped_steps},
               {"data_source", st.data_source},
               {"model_config", model_config_to_json(*st.model_config)},
               {"train_config", train_config_to_json(*st.train_config)}};
    state["data_rng"] = st.data_rng
                            ? json{{"key", st.data_rng->key}, {"counter", st.data_rng->counter}}
                            : json(nullptr);
    return state;
}

std::unique_ptr<StagedDir> stage_checkpoint_dir(const fs::path& root, int64_t step,
                                                const std::string& run_id) {
    MT_CHECK(step >= 0, "[checkpoint] negative step {}", step);
    MT_CHECK(is_run_id(run_id), "[checkpoint] saving into '{}' without a run id", root.string());
    std::error_code ec;
    fs::create_directories(root, ec);
    MT_CHECK(!ec, "[checkpoint] cannot create the checkpoint root '{}': {}", root.string(),
             ec.message());
    const fs::path final_dir = root / checkpoint_dir_name(static_cast<uint64_t>(step));
    // Never overwrite: a directory of this step is another run's (or this run's, resumed from
    // it; a run never saves twice at one step).
    MT_CHECK(!fs::exists(final_dir),
             "[checkpoint] '{}' already exists (an earlier run's?); resume from it with --resume "
             "or save into another root",
             final_dir.string());
    return std::make_unique<StagedDir>(final_dir, run_id);
}

fs::path commit_checkpoint_dir(StagedDir& staged, const fs::path& root, CheckpointIndex& index,
                               const json& state, size_t keep) {
    const auto run_id = state.at("run_id").get<std::string>();
    write_text_file(staged.path() / kCheckpointStateFile, state.dump(2) + "\n");
    index.add_file(staged.path().string(), kCheckpointStateFile);
    index.write((staged.path() / kCheckpointIndexName).string());
    staged.commit();
    const std::string name = staged.final_path().filename().string();
    write_latest_pointer(root, name, run_id);
    if (keep > 0) remove_old_checkpoints(root, keep, run_id, state.at("step").get<int64_t>());
    return staged.final_path();
}

fs::path save_training_state(const fs::path& root, const TrainingStateView& st, size_t keep) {
    MT_CHECK(st.model_config && st.train_config && st.entries && st.params,
             "[checkpoint] incomplete training state for '{}'", root.string());
    MT_CHECK(st.topology.world_size == 1,
             "[checkpoint] save_training_state writes one shard, not the {} of its topology",
             st.topology.world_size);
    // The moments of a fresh optimizer are zeros; one shared buffer covers the largest tensor.
    std::vector<float> zeros;
    if (st.m == nullptr || st.v == nullptr) {
        int64_t largest = 0;
        for (const ParamEntry& e : *st.entries) largest = std::max(largest, e.numel);
        zeros.assign(static_cast<size_t>(largest), 0.0f);
    }
    // Every tensor whole; moments of the trainable ones only, as a trainer writes them.
    std::vector<CheckpointPiece> pieces;
    for (const ParamEntry& e : *st.entries) {
        pieces.push_back(
            {CheckpointPart::param, e.name, dims_of(e), 0, e.numel, st.params + e.offset});
        if (!e.trainable) continue;
        pieces.push_back({CheckpointPart::m, e.name, dims_of(e), 0, e.numel,
                          st.m != nullptr ? st.m + e.offset : zeros.data()});
        pieces.push_back({CheckpointPart::v, e.name, dims_of(e), 0, e.numel,
                          st.v != nullptr ? st.v + e.offset : zeros.data()});
    }
    const json state = training_state_json(st);
    const std::unique_ptr<StagedDir> staged = stage_checkpoint_dir(root, st.step, st.run_id);
    const std::string shard = checkpoint_shard_file_name(0, 1);
    CheckpointIndex index;
    index.add(shard, write_checkpoint_shard((staged->path() / shard).string(), pieces,
                                            checkpoint_shard_metadata(0, st.topology)));
    return commit_checkpoint_dir(*staged, root, index, state, keep);
}

// ---- load ----

fs::path resolve_checkpoint_dir(const fs::path& dir_or_root) {
    std::error_code ec;
    MT_USER_CHECK(fs::is_directory(dir_or_root, ec),
                  "[checkpoint] '{}' is not a directory (expected a checkpoint directory or a "
                  "checkpoint root with a `latest` pointer)",
                  dir_or_root.string());
    if (fs::exists(dir_or_root / kCheckpointIndexName, ec)) return dir_or_root;
    const std::optional<std::string> latest = read_latest_pointer(dir_or_root);
    MT_USER_CHECK(
        latest.has_value(),
        "[checkpoint] '{}' holds neither a checkpoint ({} is missing) nor a `latest` pointer",
        dir_or_root.string(), kCheckpointIndexName);
    return dir_or_root / *latest;
}

std::vector<std::string> checkpoint_tensor_files(const fs::path& dir, const json& state) {
    if (!state.contains("shard_files")) return {kSingleFileCheckpointModelFile};
    const fs::path state_path = dir / kCheckpointStateFile;
    const auto files = state_field<std::vector<std::string>>(state, "shard_files", state_path);
    MT_CHECK(!files.empty(), "[checkpoint] '{}' lists no shard files", state_path.string());
    return files;
}

json read_verified_checkpoint_state(const fs::path& dir) {
    const fs::path index_path = dir / kCheckpointIndexName;
    const CheckpointIndex index = CheckpointIndex::read(index_path.string());
    auto listed = [&](const std::string& name) {
        return std::any_of(index.files.begin(), index.files.end(),
                           [&](const CheckpointIndex::File& f) { return f.name == name; });
    };
    MT_CHECK(listed(kCheckpointStateFile), "[checkpoint] index '{}' does not list {}",
             index_path.string(), kCheckpointStateFile);
    index.verify(dir.string());
    const fs::path state_path = dir / kCheckpointStateFile;
    json state;
    try {
        state = json::parse(read_text_file(state_path, kMaxCheckpointStateBytes));
    } catch (const json::exception& e) {
        MT_THROW("[checkpoint] '{}' is not valid JSON: {}", state_path.string(), e.what());
    }
    MT_CHECK(state.is_object() && state.value("format", "") == kStateFormat,
             "[checkpoint] '{}' is not a moetron checkpoint state (no \"format\": \"{}\")",
             state_path.string(), kStateFormat);
    const int version = state_field<int>(state, "version", state_path);
    MT_CHECK(version == kSingleFileCheckpointVersion || version == kCheckpointVersion,
             "[checkpoint] '{}' is version {}; this build reads versions {} and {}",
             state_path.string(), version, kSingleFileCheckpointVersion, kCheckpointVersion);
    const std::string layout = state_field<std::string>(state, "layout", state_path);
    MT_CHECK(version == kCheckpointVersion || layout == "single",
             "[checkpoint] '{}' has layout \"{}\" in a version {} (single-file) checkpoint",
             state_path.string(), layout, kSingleFileCheckpointVersion);
    MT_CHECK(version == kSingleFileCheckpointVersion || state.contains("shard_files"),
             "[checkpoint] '{}' is a sharded checkpoint without \"shard_files\"",
             state_path.string());
    for (const std::string& file : checkpoint_tensor_files(dir, state))
        MT_CHECK(listed(file), "[checkpoint] index '{}' does not list {}", index_path.string(),
                 file);
    return state;
}

CheckpointCounters checkpoint_counters(const fs::path& dir, const json& state,
                                       const ModelConfig& ours) {
    const fs::path state_path = dir / kCheckpointStateFile;
    const ModelConfig saved = model_config_from_json(
        state_field<json>(state, "model_config", state_path), state_path.string());
    const std::vector<std::string> keys = model_config_differences(saved, ours);
    if (!keys.empty()) {
        const json js = model_config_to_json(saved), jo = model_config_to_json(ours);
        std::string diff;
        for (const std::string& key : keys)
            diff += fmt::format("\n  {}: {} in the checkpoint, {} in this model", key,
                                js.at(key).dump(), jo.at(key).dump());
        MT_THROW(
            "[checkpoint] '{}' is a checkpoint of another model (its {} differs):{}\n  "
            "checkpoint: {}\n  this model: {}",
            dir.string(), kCheckpointStateFile, diff, describe_model_config(saved),
            describe_model_config(ours));
    }
    CheckpointCounters c;
    c.step = state_field<int64_t>(state, "step", state_path);
    c.optimizer_step = state_field<int64_t>(state, "optimizer_step", state_path);
    c.skipped_steps = state_field<int64_t>(state, "skipped_steps", state_path);
    MT_CHECK(
        c.step >= 0 && c.optimizer_step >= 0 && c.optimizer_step <= c.step && c.skipped_steps >= 0,
        "[checkpoint] '{}': inconsistent counters (step {}, optimizer_step {}, skipped {})",
        state_path.string(), c.step, c.optimizer_step, c.skipped_steps);
    if (state.contains("run_id")) {
        const std::string id = state_field<std::string>(state, "run_id", state_path);
        MT_CHECK(is_run_id(id), "[checkpoint] '{}': \"run_id\" '{}' is not 16 hex digits",
                 state_path.string(), id);
        c.run_id = id;
    }
    const json data_rng = state_field<json>(state, "data_rng", state_path);
    if (!data_rng.is_null()) {
        c.data_rng = RngStream::State{state_field<uint64_t>(data_rng, "key", state_path),
                                      state_field<uint64_t>(data_rng, "counter", state_path)};
    }
    return c;
}

void read_checkpoint_tensors(const fs::path& dir, const std::vector<ParamEntry>& entries,
                             float* params, float* m, float* v) {
    // state.json names the files; it was verified with them (read_verified_checkpoint_state).
    const fs::path state_path = dir / kCheckpointStateFile;
    json state;
    try {
        state = json::parse(read_text_file(state_path, kMaxCheckpointStateBytes));
    } catch (const json::exception& e) {
        MT_THROW("[checkpoint] '{}' is not valid JSON: {}", state_path.string(), e.what());
    }
    // Every name, dtype, shape and range first, so a mismatch leaves the destination untouched.
    const CheckpointTensors tensors =
        CheckpointTensors::open(dir, checkpoint_tensor_files(dir, state), entries);
    for (const ParamEntry& e : entries) {
        tensors.read(CheckpointPart::param, e.name, 0, e.numel, params + e.offset);
        if (m != nullptr) tensors.read(CheckpointPart::m, e.name, 0, e.numel, m + e.offset);
        if (v != nullptr) tensors.read(CheckpointPart::v, e.name, 0, e.numel, v + e.offset);
    }
}

}  // namespace moetron

// Parameters that hold a NaN or an infinity are never saved as a checkpoint or as --save-final
// weights: the save fails naming the parameter and the last good checkpoint, which stays
// `latest`. (A step can have a finite loss and gradient norm and still overflow the parameters in
// its update; such a run once saved a NaN checkpoint and exited 0.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include "expect_contains.h"
#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/model/config.h"
#include "moetron/train/checkpoint.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/synthetic_data.h"
#include "moetron/train/trainer.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::error_of;
using moetron::testing::TempDir;

TEST(NonFiniteCheckpoint, ParametersWithANaNAreNotSavedAndLatestStaysTheLastGoodOne) {
    const ModelConfig model = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    TrainConfig c;
    c.batch_size = 2;
    c.seq_len = 16;
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/3, /*num_bytes=*/8000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    Trainer trainer(model, c, std::move(loader));
    TempDir dir;
    const std::filesystem::path good = save_checkpoint(trainer, dir.path(), 0);

    trainer.set_steps_done(1);
    trainer.model().params()[3] = std::numeric_limits<float>::quiet_NaN();
    const std::string e = error_of([&] { save_checkpoint(trainer, dir.path(), 0); });
    EXPECT_CONTAINS(e, "holds nan at element 3");
    EXPECT_CONTAINS(e, "refusing to save it as a checkpoint");
    EXPECT_CONTAINS(e, "Last good checkpoint: " + good.string());
    EXPECT_EQ(read_latest_pointer(dir.path()), good.filename().string());
    EXPECT_EQ(list_checkpoint_dirs(dir.path()).size(), 1u);

    trainer.model().params()[3] = std::numeric_limits<float>::infinity();
    EXPECT_CONTAINS(error_of([&] { trainer.check_safe_to_save("--save-final"); }),
                    "holds inf at element 3: the update overflowed; refusing to save it as "
                    "--save-final");
}

}  // namespace
}  // namespace moetron

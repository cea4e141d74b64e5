// The pipeline layout grammar (model/pipeline_layout.h) that moetron train and moetron simulate
// share: its syntax, its check against the model, and the default placement.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moetron/core/user_error.h"
#include "moetron/model/config.h"
#include "moetron/model/layout_fit.h"
#include "moetron/model/pipeline_layout.h"
#include "moetron/parallel/layout.h"

namespace moetron {
namespace {

const std::string kModels = std::string(MOETRON_SOURCE_DIR) + "/configs/models/";

TEST(PipelineLayout, ExpandsRepetitions) {
    const auto chunks = parse_pipeline_layout("Et|(tt|)*30mL");
    ASSERT_EQ(chunks.size(), 32u);
    EXPECT_EQ(chunks[0], "Et");
    EXPECT_EQ(chunks[1], "tt");
    EXPECT_EQ(chunks[31], "mL");
    EXPECT_EQ(parse_pipeline_layout("Et*3|t*2L").at(0), "Ettt");
}

TEST(PipelineLayout, RefusesBadSyntaxAsTheUsersMistake) {
    for (const char* bad : {"Et|x", "Et||L", "(Et|L", "Et*0|L", "Et*|L"})
        EXPECT_THROW(parse_pipeline_layout(bad), UserError) << bad;
}

TEST(PipelineLayout, ChunksNameTheirBlocks) {
    const ModelConfig tiny = load_model_config(kModels + "tiny.toml");  // 3 layers, 1 MTP
    const std::vector<PipelineChunk> c = pipeline_chunks(tiny, "Et|t|tmL", 3, 1);
    ASSERT_EQ(c.size(), 3u);
    EXPECT_TRUE(c[0].embedding);
    EXPECT_EQ(c[0].num_layers, 1);
    EXPECT_EQ(c[1].first_layer, 1);
    EXPECT_EQ(c[1].num_layers, 1);
    EXPECT_FALSE(c[1].embedding || c[1].loss);
    EXPECT_EQ(c[2].first_layer, 2);
    EXPECT_EQ(c[2].num_mtp, 1);
    EXPECT_TRUE(c[2].loss);
    // Without MTP the same model takes no m.
    EXPECT_EQ(pipeline_chunks(tiny, "Ett|tL", 2, 0).at(1).num_mtp, 0);
}

TEST(PipelineLayout, RefusesLayoutsThatDoNotFitTheModel) {
    const ModelConfig tiny = load_model_config(kModels + "tiny.toml");
    auto message = [&](const char* text, int64_t chunks, int64_t mtp) {
        try {
            pipeline_chunks(tiny, text, chunks, mtp);
        } catch (const UserError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message("Et|tmL", 3, 1).find("pp*vpp = 3"), std::string::npos);
    EXPECT_NE(message("Et|tmL", 2, 1).find("places 2 layers"), std::string::npos);
    EXPECT_NE(message("Et|ttmL", 2, 0).find("MTP"), std::string::npos);
    EXPECT_NE(message("Et|ttL", 2, 1).find("places 0 MTP"), std::string::npos);
    EXPECT_NE(message("t|EttmL", 2, 1).find("first chunk"), std::string::npos);
    EXPECT_NE(message("EtL|ttm", 2, 1).find("last chunk"), std::string::npos);
    EXPECT_NE(message("EtmttL", 1, 1).find("after an MTP module"), std::string::npos);
    EXPECT_NE(message("Ettm|tL", 2, 1).find("MTP modules go in the last chunk"), std::string::npos);
    EXPECT_NE(message("Ettt|tmL", 2, 1).find("more than the 3 layers"), std::string::npos);
}

TEST(PipelineLayout, DefaultCountsEmbeddingAndHeadAsLayers) {
    const ModelConfig tiny = load_model_config(kModels + "tiny.toml");
    // E t t t m L: six blocks.
    EXPECT_EQ(default_pipeline_layout(tiny, 1, 1), "Et*3mL");
    EXPECT_EQ(default_pipeline_layout(tiny, 2, 1), "Et*2|tmL");
    EXPECT_EQ(default_pipeline_layout(tiny, 3, 0), "E|t*2|tL");
    // The MTP module stays with the head: the last chunk takes a block from the one before.
    EXPECT_EQ(default_pipeline_layout(tiny, 4, 1), "E|t*2|t|mL");
    EXPECT_EQ(default_pipeline_layout(tiny, 4, 0), "E|t*2|t|L");
    EXPECT_THROW(default_pipeline_layout(tiny, 6, 1), UserError);  // E t t t mL: 5 at most
    EXPECT_THROW(default_pipeline_layout(tiny, 7, 1), UserError);
    // DeepSeek-V3: E, 61 layers, one MTP module, L = 64 blocks, 4 per chunk on 16 chunks.
    const ModelConfig v3 = load_model_config(kModels + "dsv3-671b.toml");
    const std::string v3_layout = default_pipeline_layout(v3, 16, 1);
    EXPECT_EQ(v3_layout, "Et*3|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*2mL");
    // Every default is a valid layout for the model.
    for (int64_t chunks : {1, 2, 4, 8, 16, 32, 63}) {
        const std::string text = default_pipeline_layout(v3, chunks, 1);
        EXPECT_EQ(static_cast<int64_t>(pipeline_chunks(v3, text, chunks, 1).size()), chunks);
    }
}

// A chunk may hold the embedding or the head alone, so tiny (6 blocks) takes pp4 and even pp6.
TEST(PipelineLayout, LayoutFitCountsEmbeddingAndHeadAsBlocks) {
    const ModelConfig tiny = load_model_config(kModels + "tiny.toml");
    EXPECT_NO_THROW(validate_layout_for_model(parallel::parse_layout("pp4", 4), tiny));
    EXPECT_NO_THROW(validate_layout_for_model(parallel::parse_layout("pp2.vpp3", 6), tiny));
    EXPECT_THROW(validate_layout_for_model(parallel::parse_layout("pp7", 7), tiny), UserError);
}

}  // namespace
}  // namespace moetron

// DeepSeekMoE layer (DeepSeek-V3 report sec. 2.1.2, eq. 12-16) on one rank holding every expert:
//   logits = x Wg^T; s = sigmoid(logits); group-limited top-K of s + b (b: correction bias, for
//   selection only); w = normalized s of the chosen experts x routed_scaling_factor
//   out = sum_k w_k SwiGLU_{e_k}(x) + SwiGLU_shared(x)
// The routed experts run as one grouped GEMM over the token copies sorted by expert. An
// ExpertDispatcher (parallel/expert_dispatcher.h) moves the copies there and back: a local
// permutation when this rank holds every expert, an all-to-all over the EP group when the experts
// are split (expert parallelism: this rank holds El = E / ep of them; the router still scores all
// E).
//
// Also the sequence-wise balance loss (eq. 17-20), per sequence of T tokens:
//   f_i = E / (K T) sum_t 1[i in topk(t)],  s'_{i,t} = s_{i,t} / sum_j s_{j,t},
//   P_i = (1/T) sum_t s'_{i,t},  L = alpha sum_i f_i P_i,
// averaged over the micro-batch's sequences. Its gradient reaches s through P only (f counts).
//
// Tensor parallelism: the TP ranks hold the same N tokens. Routed experts keep expert-TP = 1 and
// are parallel-folded over EP x EDP, which count every rank of the world as a different token
// source, so each TP rank sends only its 1/tp share of the tokens (rows [r*N/tp, (r+1)*N/tp)) to
// the experts and counts only their loads. The router itself scores all N tokens on every TP rank
// (a small GEMM): the gate's gradient is then the same on every TP rank (summed over DP only, like
// any replicated parameter) and the balance loss needs no communication. The shared experts are
// column/row-parallel (mlp.h). The output is a partial sum over TP, which the caller reduces
// (block.h): per token row, the shared experts' partial outputs plus the routed output on the
// rank that owns the row (the other ranks add 0). The input gradient likewise: the shared
// experts' partial one plus, on the owning rank only, the routed and router parts. The backward
// all-gathers the routing weights' gradient for the router.
#pragma once

#include <cstdint>
#include <string>

#include <string_view>

#include "moetron/kernels/backend.h"
#include "moetron/model/compute.h"
#include "moetron/model/mlp.h"
#include "moetron/model/params.h"
#include "moetron/parallel/dispatch_traffic.h"
#include "moetron/parallel/tensor_parallel.h"

namespace moetron::parallel {
class ExpertDispatcher;
}

namespace moetron {

// The routed experts a rank holds: global experts [first, first + count). count 0 means all E
// (one process). Counter-based initialization reads it, so that expert e gets the same numbers on
// whichever rank holds it. With redundant experts (--redundant-experts R) the range is one of
// physical slots [first, first + count) of num_slots = E + R, each holding the logical expert an
// ExpertPlacement (parallel/expert_placement.h) gives it.
struct ExpertShard {
    int64_t first = 0;
    int64_t count = 0;
    int64_t num_slots = 0;  // 0: E (no redundant experts)
    int64_t slots(int64_t num_experts) const { return num_slots > 0 ? num_slots : num_experts; }
    int64_t local_experts(int64_t num_experts) const { return count > 0 ? count : num_experts; }
};

// How a MoE layer hides its all-to-all behind computation (--moe-overlap; the results are the
// same rows exchanged and the same sums taken, only in another order):
//   off:    each data movement blocks; the shared experts run after the combine.
//   shared: the shared experts compute while the dispatch flies (forward), and their backward while
//           combine's backward flies; they write the output first and the combine adds to it.
//   dual:   as shared, and the layer's tokens split in two halves A and B, each with its own
//           routing (dispatcher slot and exchange buffer), so that one half's all-to-all flies
//           while the other half's experts compute (DeepSeek-V3 sec. 3.2.2's dual micro-batch
//           overlap, inside one layer):
//             forward:  route A, B; dispatch A | shared experts; dispatch B | experts A;
//                       combine A | experts B; combine B
//             backward: combine' A | shared experts'; combine' B | experts' A;
//                       dispatch' A | experts' B; dispatch' B
//           (x | y: x's all-to-all in flight while y computes; with two_tier, A's combine and
//           dispatch' post their second hop, the rail, before B's experts, so it flies too). The
//           expert weight gradients sum over A's rows, then B's: equal to off within float
//           rounding, not bit for bit.
enum class MoeOverlap { off, shared, dual };
MoeOverlap parse_moe_overlap(std::string_view name);  // "off" | "shared" | "dual"; throws otherwise
std::string_view moe_overlap_name(MoeOverlap overlap);

// Letters: E experts, El local experts (E without expert parallelism), K experts per token,
// F = moe_intermediate_size, Fs = n_shared_experts * F (this rank's Fs / tp under tensor
// parallelism), R rows on the expert side (N*K without expert parallelism).
struct MoeParams {
    ExpertShard experts;               // set before binding (bind_moe_params reads it)
    float* gate = nullptr;             // (E, D) router weight (HF mlp.gate.weight)
    float* correction_bias = nullptr;  // (E) e_score_correction_bias: selection only, not trained
    float* experts_gate_up = nullptr;  // (El, 2F, D): per local expert [gate_proj; up_proj]
    float* experts_down = nullptr;     // (El, D, F)
    MlpParams shared;                  // (2Fs, D), (D, Fs); unset when n_shared_experts == 0
};

// True for the routed experts' tensors ("...experts.gate_up", "...experts.down"): split over the
// EP group, their gradients summed over the expert-data-parallel group only.
bool is_routed_expert_param(std::string_view name);

struct MoeActivations {
    // Set before binding: R, the rows of the expert-side buffers (0: N*K, every expert here).
    int64_t expert_rows = 0;
    // Set after binding: who moves this layer's token copies, and the dispatcher's slot that
    // keeps the layer's routing from the forward to the backward.
    parallel::ExpertDispatcher* dispatcher = nullptr;
    int64_t dispatch_slot = 0;
    MoeOverlap overlap = MoeOverlap::off;
    int64_t dispatch_slot_b = -1;  // dual: the second half's slot (its own exchange buffer)
    // The format the tokens travel to the routed experts in (MoeSettings::token_format), passed
    // with each dispatch; when it is the experts' GEMM format, the GEMM takes the rows as they
    // arrive.
    Precision token_format = Precision::fp32;
    // When set, the seconds this rank spends in the routed experts' computation (grouped GEMMs
    // and SwiGLU, forward and backward) are added to it: host time, exact on the CPU backend.
    double* expert_compute_s = nullptr;
    // When set, the expert-side rows (token copies) this rank's routed experts compute are added
    // to it, once per backward: what the dispatch brought them.
    int64_t* expert_rows_computed = nullptr;

    float* scores = nullptr;          // (N, E) sigmoid scores s
    int32_t* topk_ids = nullptr;      // (N, K) chosen experts (global ids)
    float* topk_weights = nullptr;    // (N, K) their gating weights
    float* permuted = nullptr;        // (R, D) expert inputs, sorted by local expert
    float* expert_gate_up = nullptr;  // (R, 2F)
    float* expert_hidden = nullptr;   // (R, F)
    float* expert_out = nullptr;      // (R, D)
    float* load_fraction = nullptr;   // (B, E) f_i of eq. 18 per sequence
    MlpActivations shared;            // (N, 2Fs), (N, Fs)
};

// Temporaries shared by every MoE layer (they run one at a time).
struct MoeScratch {
    int64_t expert_rows = 0;              // set before binding: R as in MoeActivations
    float* logits = nullptr;              // (N, E) router logits; their gradient in backward
    float* d_topk_weights = nullptr;      // (N, K)
    float* d_scores = nullptr;            // (N, E) the balance loss's gradient on s
    float* d_expert_out = nullptr;        // (R, D); later the gradient of the expert inputs
    float* d_expert_hidden = nullptr;     // (R, F)
    float* d_expert_gate_up = nullptr;    // (R, 2F)
    float* d_topk_weights_own = nullptr;  // (N/tp, K) the rank's share, before the all-gather;
                                          // bound only when tp > 1
};

// True for the buffers bind_moe_activations and bind_moe_scratch size by R, the expert-side rows
// (for memory reports).
bool is_expert_side_buffer(std::string_view name);

void bind_moe_params(ParamBinder& b, MoeParams& p, const std::string& prefix, const ModelConfig& c);
void bind_moe_activations(BufferBinder& b, MoeActivations& a, const std::string& prefix,
                          const ModelConfig& c, int tp_size, int64_t batch, int64_t seq_len);
void bind_moe_scratch(BufferBinder& b, MoeScratch& s, const std::string& prefix,
                      const ModelConfig& c, int tp_size, int64_t num_tokens);
// Fs / tp: the shared experts' intermediate size on one TP rank.
int64_t shared_expert_ffn_dim(const ModelConfig& c, int tp_size);

// out (N, D) written: this rank's partial sum over TP (the whole output with tp = 1). When
// load_counts (E, in ops' memory) is not null, the tokens routed to each expert are
// added to it. With expert parallelism every rank of the EP group must call it (it exchanges the
// token copies), and likewise moe_backward; with tensor parallelism, every rank of the TP group
// too. Returns alpha * (the balance loss averaged over the B sequences); 0 when alpha = 0.
// A routing whose rows exceed the expert-side buffers (R, planned from the capacity factor) runs
// in rounds (ExpertDispatcher::plan_rounds): dispatch, experts and combine of each round's tokens
// through the same buffers, blocking, whatever the overlap; they keep the last round's
// activations, and moe_backward runs the rounds last to first, recomputing the earlier rounds'
// experts. Dropless; equal to one round within float rounding.
double moe_forward(const ModelCompute& compute, float* out, const MoeActivations& saved,
                   int64_t* load_counts, const float* inp, const MoeParams& w,
                   const MoeScratch& scratch, const ModelConfig& c,
                   const parallel::TensorParallel& tp, float balance_alpha, int64_t batch,
                   int64_t seq_len);
// dinp (N, D) written (partial over TP, as out); grads accumulate. balance_grad = d(total
// loss)/d(balance loss) times alpha (alpha * grad_scale); 0 skips the balance term.
void moe_backward(const ModelCompute& compute, float* dinp, const MoeParams& grads,
                  const float* dout, const float* inp, const MoeActivations& saved,
                  const MoeParams& w, const MoeScratch& scratch, const MlpScratch& shared_scratch,
                  const ModelConfig& c, const parallel::TensorParallel& tp, float balance_grad,
                  int64_t batch, int64_t seq_len);

}  // namespace moetron

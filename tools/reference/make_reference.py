#!/usr/bin/env python3
"""Writes the PyTorch reference dump that the C++ model test checks itself against.

Builds Hugging Face transformers' DeepseekV3ForCausalLM (an independent implementation) from a
moetron TOML model preset, initializes it from a fixed seed, runs one forward and backward pass
in float32 on fixed tokens and writes weights, inputs, targets, logits, loss, every gradient and a
few activations for debugging to one binary file. Format and conventions: tools/reference/README.md.

    python tools/reference/make_reference.py [--config configs/models/tiny.toml]
                                             [--out tests/data/tiny_reference.bin]
"""

import argparse
import math
import pathlib
import sys
import tomllib

import numpy as np
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from mtref import write_reference

REPO = pathlib.Path(__file__).resolve().parents[2]
BATCH = 2
SEQ = 16
TOKEN_SEED = 20240601
BASE_WEIGHT_SEED = 1234
BIAS_STD = 0.01  # e_score_correction_bias spread: moves some selections, keeps scores comparable
NORM_WEIGHT_STD = 0.1  # RMSNorm gains are 1 + N(0, 0.1) so that their gradients are not trivial
TIE_MARGIN = 1e-4  # routing decisions must be at least this far from a tie

# The preset keys the model computation depends on; echoed as "config.<key>" f64 scalars.
INT_KEYS = [
    "vocab_size", "hidden_size", "num_hidden_layers", "first_k_dense_replace", "moe_layer_freq",
    "intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
    "num_experts_per_tok", "n_group", "topk_group", "num_attention_heads", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "max_position_embeddings",
]
FLOAT_KEYS = ["routed_scaling_factor", "rope_theta", "rms_norm_eps", "initializer_range"]
BOOL_KEYS = ["norm_topk_prob", "tie_word_embeddings"]
# Read and checked but not echoed: MTP is not part of Hugging Face's model (see README).
OTHER_KEYS = {"name", "scoring_func", "topk_method", "num_nextn_predict_layers"}


def load_preset(path: pathlib.Path) -> dict:
    with open(path, "rb") as f:
        table = tomllib.load(f)
    table.pop("train", None)  # the trainer's table; not part of the model
    known = set(INT_KEYS) | set(FLOAT_KEYS) | set(BOOL_KEYS) | OTHER_KEYS
    unknown = sorted(set(table) - known)
    if unknown:
        sys.exit(f"{path}: unknown keys {unknown}")
    defaults = {"moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
                "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "initializer_range": 0.02,
                "norm_topk_prob": True, "tie_word_embeddings": False, "q_lora_rank": 0,
                "max_position_embeddings": 4096, "scoring_func": "sigmoid",
                "topk_method": "noaux_tc", "num_nextn_predict_layers": 0}
    preset = {**defaults, **table}
    missing = sorted((set(INT_KEYS) | set(FLOAT_KEYS) | set(BOOL_KEYS)) - set(preset))
    if missing:
        sys.exit(f"{path}: missing keys {missing}")
    # Hugging Face's model hard-codes these; a preset asking for anything else cannot be checked.
    if preset["scoring_func"] != "sigmoid" or preset["topk_method"] != "noaux_tc":
        sys.exit(f"{path}: only scoring_func=sigmoid, topk_method=noaux_tc are modelled by HF")
    if preset["moe_layer_freq"] != 1:
        sys.exit(f"{path}: HF makes every layer from first_k_dense_replace on MoE; "
                 "moe_layer_freq must be 1")
    if preset["tie_word_embeddings"]:
        sys.exit(f"{path}: the reference is for untied embeddings")
    return preset


def hf_config(p: dict, attn: str = "eager", experts: str = "eager") -> DeepseekV3Config:
    return DeepseekV3Config(
        vocab_size=p["vocab_size"],
        hidden_size=p["hidden_size"],
        num_hidden_layers=p["num_hidden_layers"],
        first_k_dense_replace=p["first_k_dense_replace"],
        intermediate_size=p["intermediate_size"],
        moe_intermediate_size=p["moe_intermediate_size"],
        n_routed_experts=p["n_routed_experts"],
        n_shared_experts=p["n_shared_experts"],
        num_experts_per_tok=p["num_experts_per_tok"],
        n_group=p["n_group"],
        topk_group=p["topk_group"],
        routed_scaling_factor=p["routed_scaling_factor"],
        norm_topk_prob=p["norm_topk_prob"],
        num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_attention_heads"],
        q_lora_rank=p["q_lora_rank"] or None,  # moetron's 0 is HF's None: a plain q_proj
        kv_lora_rank=p["kv_lora_rank"],
        qk_nope_head_dim=p["qk_nope_head_dim"],
        qk_rope_head_dim=p["qk_rope_head_dim"],
        v_head_dim=p["v_head_dim"],
        max_position_embeddings=p["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": float(p["rope_theta"])},
        rope_interleave=True,
        rms_norm_eps=p["rms_norm_eps"],
        initializer_range=p["initializer_range"],
        tie_word_embeddings=False,
        attention_bias=False,
        attention_dropout=0.0,
        hidden_act="silu",
        num_mtp_layers=0,
        attn_implementation=attn,
        experts_implementation=experts,
    )


def init_weights(model: torch.nn.Module, std: float, seed: int) -> None:
    """Every tensor from one generator in state_dict order: the dump depends on the seed only."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("e_score_correction_bias"):
                t.copy_(torch.randn(t.shape, generator=gen) * BIAS_STD)
            elif "norm" in name.rsplit(".", 2)[-2]:  # RMSNorm gains
                t.copy_(1.0 + torch.randn(t.shape, generator=gen) * NORM_WEIGHT_STD)
            else:
                t.copy_(torch.randn(t.shape, generator=gen) * std)


def group_limited_topk(choice: torch.Tensor, gate: torch.nn.Module):
    """Our own reading of DeepSeek-V3's routing: returns (sorted expert ids, margins to a tie)."""
    n_tok, n_exp = choice.shape
    per_group = n_exp // gate.num_group
    grouped = choice.view(n_tok, gate.num_group, per_group)
    group_scores = grouped.topk(min(2, per_group), dim=-1)[0].sum(-1)
    margins = []
    if gate.topk_group < gate.num_group:
        g = group_scores.sort(dim=-1, descending=True)[0]
        margins.append((g[:, gate.topk_group - 1] - g[:, gate.topk_group]).min().item())
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(gate.topk_group, dim=-1)[1], True)
    masked = choice.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
    s = masked.sort(dim=-1, descending=True)[0]
    if gate.top_k < gate.topk_group * per_group:
        margins.append((s[:, gate.top_k - 1] - s[:, gate.top_k]).min().item())
    return masked.topk(gate.top_k, dim=-1)[1].sort(dim=-1)[0], margins


def routing_stats(gate_input: torch.Tensor, gate: torch.nn.Module, hf_indices: torch.Tensor):
    """Smallest distance from a tie over one router's decisions, and how many tokens the bias
    moved; also checks our reading of the router against HF's choice."""
    x = gate_input.reshape(-1, gate.hidden_dim).float()
    scores = torch.sigmoid(x @ gate.weight.float().t())
    ours, margins = group_limited_topk(scores + gate.e_score_correction_bias, gate)
    if not torch.equal(ours, hf_indices):
        sys.exit("our reading of the router disagrees with HF's selection")
    unbiased, _ = group_limited_topk(scores, gate)
    moved = int((unbiased != ours).any(dim=-1).sum())
    return (min(margins) if margins else math.inf), moved


def run_reference(preset: dict, weight_seed: int):
    model = DeepseekV3ForCausalLM(hf_config(preset)).float()
    model.train()
    init_weights(model, preset["initializer_range"], weight_seed)

    gen = torch.Generator().manual_seed(TOKEN_SEED)
    inputs = torch.randint(0, preset["vocab_size"], (BATCH, SEQ), generator=gen)
    targets = torch.full_like(inputs, -1)
    targets[:, :-1] = inputs[:, 1:]  # logits at t predict token t+1; the last position is ignored

    acts, gate_inputs, routes = {}, {}, {}
    hooks = [model.model.embed_tokens.register_forward_hook(
        lambda m, i, o: acts.__setitem__("act.embed", o.detach().clone()))]
    for idx, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, i, o, idx=idx: acts.__setitem__(f"act.layers.{idx}", o.detach().clone())))
        if hasattr(layer.mlp, "gate"):
            def gate_hook(m, i, o, idx=idx):
                gate_inputs[idx] = i[0].detach().clone()
                _, weights, indices = o
                order = indices.argsort(dim=-1)  # HF's top-k is unsorted; store by expert id
                routes[idx] = (indices.gather(1, order), weights.detach().gather(1, order))
            hooks.append(layer.mlp.gate.register_forward_hook(gate_hook))
    hooks.append(model.model.norm.register_forward_hook(
        lambda m, i, o: acts.__setitem__("act.norm", o.detach().clone())))

    logits = model(input_ids=inputs).logits  # (B, S, V)
    # Our own loss: mean cross-entropy over the targets that are not -1.
    valid = targets >= 0
    logp = torch.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    loss = nll[valid].sum() / valid.sum()
    loss.backward()
    for h in hooks:
        h.remove()

    stats = [routing_stats(gate_inputs[i], model.model.layers[i].mlp.gate, routes[i][0])
             for i in routes]
    margin = min((m for m, _ in stats), default=math.inf)
    moved = sum(n for _, n in stats)
    return model, inputs, targets, logits.detach(), loss.detach(), acts, routes, margin, moved


def plain_forward(w: dict, p: dict, inputs: torch.Tensor) -> torch.Tensor:
    """The model as README.md describes it, written from scratch on the state dict: if this agrees
    with HF's logits, the README's layout notes are what HF computes. RoPE here rotates the
    interleaved pairs in place (DeepSeek's own form) rather than HF's de-interleaving form."""
    B, S = inputs.shape
    H, dn, dr, dv = (p["num_attention_heads"], p["qk_nope_head_dim"], p["qk_rope_head_dim"],
                     p["v_head_dim"])
    F, E, K = p["moe_intermediate_size"], p["n_routed_experts"], p["num_experts_per_tok"]
    G, TG = p["n_group"], p["topk_group"]

    def rms(x, g, eps):
        return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def swiglu(x, wg, wu, wd):
        return (torch.nn.functional.silu(x @ wg.t()) * (x @ wu.t())) @ wd.t()

    inv_freq = 1.0 / (p["rope_theta"] ** (torch.arange(0, dr, 2, dtype=torch.float32) / dr))
    angle = torch.arange(S, dtype=torch.float32)[:, None] * inv_freq  # (S, R/2)
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]

    def rope(x):  # x (B, S, heads, R): pairs (x[2i], x[2i+1]) rotated by angle[s, i]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)

    mask = torch.ones(S, S, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][inputs]
    for layer in range(p["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        a = pre + "self_attn."
        h = rms(x, w[pre + "input_layernorm.weight"], p["rms_norm_eps"])
        cq = rms(h @ w[a + "q_a_proj.weight"].t(), w[a + "q_a_layernorm.weight"], 1e-6)
        q = (cq @ w[a + "q_b_proj.weight"].t()).view(B, S, H, dn + dr)  # per head [nope | rope]
        ckv = h @ w[a + "kv_a_proj_with_mqa.weight"].t()  # [latent (kv_lora) | shared k_rope (R)]
        lat = rms(ckv[..., : p["kv_lora_rank"]], w[a + "kv_a_layernorm.weight"], 1e-6)
        kr = rope(ckv[..., None, p["kv_lora_rank"]:]).expand(B, S, H, dr)
        kv = (lat @ w[a + "kv_b_proj.weight"].t()).view(B, S, H, dn + dv)  # per head [k_nope | v]
        qf = torch.cat((q[..., :dn], rope(q[..., dn:])), -1)
        kf = torch.cat((kv[..., :dn], kr), -1)
        att = torch.einsum("bshd,bthd->bhst", qf, kf) / math.sqrt(dn + dr)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        o = torch.einsum("bhst,bthd->bshd", att, kv[..., dn:]).reshape(B, S, H * dv)
        x = x + o @ w[a + "o_proj.weight"].t()
        h = rms(x, w[pre + "post_attention_layernorm.weight"], p["rms_norm_eps"])
        m = pre + "mlp."
        if layer < p["first_k_dense_replace"]:
            x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"],
                           w[m + "down_proj.weight"])
            continue
        t = h.reshape(B * S, -1)
        scores = torch.sigmoid(t @ w[m + "gate.weight"].t())
        choice = scores + w[m + "gate.e_score_correction_bias"]
        gsc = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
        gkeep = torch.zeros_like(gsc, dtype=torch.bool).scatter_(1, gsc.topk(TG, dim=-1)[1], True)
        ids = choice.masked_fill(~gkeep.repeat_interleave(E // G, 1), float("-inf")).topk(K, -1)[1]
        wts = scores.gather(1, ids)
        if p["norm_topk_prob"]:
            wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
        wts = wts * p["routed_scaling_factor"]
        routed = torch.zeros_like(t)
        for e in range(E):
            gu = w[m + "experts.gate_up_proj"][e]  # (2F, D): rows [0, F) gate, [F, 2F) up
            y = swiglu(t, gu[:F], gu[F:], w[m + "experts.down_proj"][e])
            routed += y * (wts * (ids == e)).sum(-1, keepdim=True)
        se = m + "shared_experts."
        shared = swiglu(t, w[se + "gate_proj.weight"], w[se + "up_proj.weight"],
                        w[se + "down_proj.weight"])
        x = x + (routed + shared).view(B, S, -1)
    x = rms(x, w["model.norm.weight"], p["rms_norm_eps"])
    return x @ w["lm_head.weight"].t()


def f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype("<f4")


def scalar(v: float) -> np.ndarray:
    return np.array([v], dtype="<f8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/models/tiny.toml"))
    ap.add_argument("--out", default=str(REPO / "tests/data/tiny_reference.bin"))
    args = ap.parse_args()

    torch.set_num_threads(1)  # one thread: the same summation order, the same bytes, every run
    torch.use_deterministic_algorithms(True)
    preset = load_preset(pathlib.Path(args.config))

    # The first seed whose routing has no decision within TIE_MARGIN of a tie, so that a float32
    # reimplementation with different rounding is certain to pick the same experts.
    for weight_seed in range(BASE_WEIGHT_SEED, BASE_WEIGHT_SEED + 100):
        model, inputs, targets, logits, loss, acts, routes, margin, moved = run_reference(
            preset, weight_seed)
        # The bias must change some selection (group limits and unbiased top-k differ), or the
        # bias-for-selection-only path goes untested.
        if margin > TIE_MARGIN and (moved > 0 or not routes):
            break
    else:
        sys.exit("no seed in 100 gives routing clear of ties with the bias changing a choice")

    with torch.no_grad():
        mine = plain_forward({k: v.detach() for k, v in model.state_dict().items()}, preset, inputs)
    diff = (mine - logits).abs().max().item()
    if diff > 1e-4:
        sys.exit(f"the README's description of the model disagrees with HF: "
                 f"max |dlogits| {diff:.2e}")

    records = []
    for key in INT_KEYS + FLOAT_KEYS:
        records.append((f"config.{key}", scalar(float(preset[key]))))
    for key in BOOL_KEYS:
        records.append((f"config.{key}", scalar(1.0 if preset[key] else 0.0)))
    records.append(("config.rope_interleave", scalar(1.0)))
    records.append(("meta.weight_seed", scalar(weight_seed)))
    records.append(("meta.min_routing_margin", scalar(margin)))
    records.append(("meta.tokens_moved_by_bias", scalar(moved)))
    records.append(("inputs", inputs.numpy().astype("<i4")))
    records.append(("targets", targets.numpy().astype("<i4")))
    records.append(("logits", f32(logits)))
    records.append(("loss", f32(loss.reshape(1))))
    params = dict(model.named_parameters())
    for name, t in model.state_dict().items():
        records.append((name, f32(t)))
    for name, t in model.state_dict().items():
        if name in params:  # e_score_correction_bias is a buffer: it has no gradient
            records.append((name + ".grad", f32(params[name].grad)))
    layer_acts = [f"act.layers.{i}" for i in range(len(model.model.layers))]
    for name in ["act.embed"] + layer_acts + ["act.norm"]:
        records.append((name, f32(acts[name])))
    for idx, (indices, weights) in sorted(routes.items()):
        records.append((f"route.layers.{idx}.topk_indices", indices.numpy().astype("<i4")))
        records.append((f"route.layers.{idx}.topk_weights", f32(weights)))

    out = pathlib.Path(args.out)
    write_reference(out, records)
    print(f"{out}: {len(records)} tensors, {out.stat().st_size} bytes, loss {loss.item():.6f}, "
          f"weight seed {weight_seed}, min routing margin {margin:.2e}, "
          f"{moved} token-layers routed differently than without the bias, "
          f"README model matches HF logits to {diff:.1e}")


if __name__ == "__main__":
    main()

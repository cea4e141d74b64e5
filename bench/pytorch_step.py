#!/usr/bin/env python3
"""PyTorch side of the CPU step-throughput comparison: one training step (forward, backward,
gradient clipping, AdamW) of a moetron model preset through Hugging Face's DeepseekV3ForCausalLM,
timed over N steps after a warm-up. Prints one JSON line:

    {"impl": "pytorch", "tokens_per_s": ..., "batch": .., "seq": .., "threads": .., ...}

    python bench/pytorch_step.py [--config configs/models/small.toml] [--batch-size B] [--seq-len S]
                                 [--threads T] [--warmup 2] [--steps 5] [--precision fp32|bf16]

--precision bf16 is mixed precision as Hugging Face's Trainer runs it on a CPU with --bf16
(accelerate's mixed_precision="bf16"): the forward and the loss under
torch.autocast("cpu", dtype=torch.bfloat16), so that autocast's ops (the GEMMs among them) run in
bfloat16, while the master weights, their gradients and AdamW's state stay float32.

batch/seq/lr/weight_decay/grad_clip default to the preset's [train] table. HF's model has no MTP
module and no sequence-wise balance loss or router-bias update, so pair it with a moetron run
that has those off (see tools/reference/README.md).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
import tomllib

import torch
import torch.nn.functional as F

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "reference"))
from make_reference import hf_config, load_preset  # noqa: E402  (one TOML -> HF mapping)
from transformers import DeepseekV3ForCausalLM  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/models/small.toml"))
    ap.add_argument("--batch-size", type=int, help="sequences per step (default: [train] batch_size)")
    ap.add_argument("--seq-len", type=int, help="tokens per sequence (default: [train] seq_len)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--attn", default="sdpa", help="HF attention implementation (sdpa, eager)")
    # HF's own default, grouped_mm, ran 2.7x slower than eager on the small preset on our CPU
    # (152 vs 411 tokens/s, 2 threads); the comparison uses PyTorch's fastest path.
    ap.add_argument("--experts", default="eager",
                    help="HF experts implementation (eager, batched_mm, grouped_mm)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="fp32, or bf16 mixed precision (autocast, float32 master weights)")
    args = ap.parse_args()

    with open(args.config, "rb") as f:
        train = tomllib.load(f).get("train", {})
    batch = args.batch_size or train.get("batch_size", 8)
    seq = args.seq_len or train.get("seq_len", 512)
    preset = load_preset(pathlib.Path(args.config))
    if seq > preset["max_position_embeddings"]:
        sys.exit(f"seq {seq} exceeds max_position_embeddings {preset['max_position_embeddings']}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(train.get("seed", 1234))
    model = DeepseekV3ForCausalLM(hf_config(preset, attn=args.attn, experts=args.experts)).float()
    model.train()
    # DeepSeek-V3's AdamW settings (report sec. 4.2): betas (0.9, 0.95), eps 1e-8.
    opt = torch.optim.AdamW(model.parameters(), lr=train.get("lr", 1e-3), betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=train.get("weight_decay", 0.1))
    grad_clip = train.get("grad_clip", 1.0)

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, preset["vocab_size"], (batch, seq + 1), generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    # HF's Trainer computes the loss inside the model's forward, so under the same autocast.
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    cpu_times = []  # process CPU seconds per step: on one thread, the work a loaded machine hides

    def step() -> float:
        t0 = time.perf_counter()
        c0 = time.process_time()
        with autocast:
            logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        cpu_times.append(time.process_time() - c0)
        return time.perf_counter() - t0

    for _ in range(args.warmup):
        step()
    cpu_times.clear()
    times = [step() for _ in range(args.steps)]
    total = sum(times)
    print(json.dumps({
        "impl": "pytorch",
        "tokens_per_s": batch * seq * len(times) / total,
        "batch": batch,
        "seq": seq,
        "threads": args.threads,
        "model": preset.get("name", pathlib.Path(args.config).stem),
        "params": sum(p.numel() for p in model.parameters()),
        "step_ms_median": 1e3 * statistics.median(times),
        "step_cpu_ms_median": 1e3 * statistics.median(cpu_times),
        "steps": len(times),
        "attn": model.config._attn_implementation,
        "experts": model.config._experts_implementation,
        "torch": torch.__version__,
        "mtp": False,
        "precision": args.precision,
    }))


if __name__ == "__main__":
    main()

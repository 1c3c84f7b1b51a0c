#!/usr/bin/env python3
"""Write a synthetic Mixtral-shaped checkpoint (config.json + sharded BF16
safetensors) for benchmarks: random weights, real layout, any size.

Only numpy is needed (no torch, no safetensors package): the safetensors files
are written by hand following the format (u64 header length, JSON header,
data). Not run by CI.

    python3 tests/bench/make_synthetic_checkpoint.py /tmp/synth-1g            # ~1.3 GB
    python3 tests/bench/make_synthetic_checkpoint.py /tmp/synth-s --layers 2  # smaller
"""
import argparse
import json
import os
import struct

import numpy as np


def bf16_bytes(rng, shape, scale):
    """Random normal values as little-endian bfloat16 bytes (truncated float32)."""
    a = (rng.standard_normal(shape, dtype=np.float32) * scale).view(np.uint32)
    a = ((a + 0x7FFF + ((a >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    return a.astype("<u2").tobytes()


def write_shard(path, tensors):
    """tensors: list of (name, shape, bytes) in file order."""
    header, off = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, data in tensors:
            f.write(data)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    H, F, hd = a.hidden, a.ffn, a.hidden // a.heads
    cfg = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": a.vocab,
        "hidden_size": H, "intermediate_size": F, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "num_local_experts": a.experts,
        "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_position_embeddings": 4096,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    weight_map, total = {}, 0
    shards = [[("model.embed_tokens.weight", (a.vocab, H), bf16_bytes(rng, (a.vocab, H), 0.02)),
               ("model.norm.weight", (H,), bf16_bytes(rng, (H,), 0.1)),
               ("lm_head.weight", (a.vocab, H), bf16_bytes(rng, (a.vocab, H), 0.02))]]
    for l in range(a.layers):
        p = f"model.layers.{l}."
        t = [(p + "input_layernorm.weight", (H,), bf16_bytes(rng, (H,), 0.1)),
             (p + "post_attention_layernorm.weight", (H,), bf16_bytes(rng, (H,), 0.1)),
             (p + "self_attn.q_proj.weight", (a.heads * hd, H), bf16_bytes(rng, (a.heads * hd, H), 0.02)),
             (p + "self_attn.k_proj.weight", (a.kv_heads * hd, H), bf16_bytes(rng, (a.kv_heads * hd, H), 0.02)),
             (p + "self_attn.v_proj.weight", (a.kv_heads * hd, H), bf16_bytes(rng, (a.kv_heads * hd, H), 0.02)),
             (p + "self_attn.o_proj.weight", (H, a.heads * hd), bf16_bytes(rng, (H, a.heads * hd), 0.02)),
             (p + "block_sparse_moe.gate.weight", (a.experts, H), bf16_bytes(rng, (a.experts, H), 0.02))]
        for e in range(a.experts):
            q = f"{p}block_sparse_moe.experts.{e}."
            t += [(q + "w1.weight", (F, H), bf16_bytes(rng, (F, H), 0.02)),
                  (q + "w2.weight", (H, F), bf16_bytes(rng, (H, F), 0.02)),
                  (q + "w3.weight", (F, H), bf16_bytes(rng, (F, H), 0.02))]
        shards.append(t)
    n = len(shards)
    for i, t in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write_shard(os.path.join(a.out, name), t)
        for tn, _, data in t:
            weight_map[tn] = name
            total += len(data)
        print(f"wrote {name}", flush=True)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"{a.out}: {total / 1e9:.2f} GB of BF16 weights in {n} shards")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Write a Mixtral or Qwen3-MoE checkpoint directory (config.json +
safetensors, BF16 or F32) as a GGUF file that llama.cpp loads, with the
`gguf` package: for the side-by-side benchmark (tests/bench/bench-llama.py)
and the GGUF round trip of the fine-grained model (tests/bench/gguf-roundtrip.sh).
Not run by CI.

    python3 tests/bench/hf_to_gguf.py datasets/models/tiny-moe-mixtral /tmp/tiny.gguf
    python3 tests/bench/hf_to_gguf.py datasets/models/tiny-moe-qwen3 /tmp/qwen3.gguf --vocab hf

What it writes for Mixtral: llama.cpp's "llama" architecture with experts
(its Mixtral layout): token_embd, output_norm, output (unless the embeddings
are tied), and per layer attn_norm, attn_q/k (rows permuted from the Hugging
Face rotate-half order to llama.cpp's interleaved RoPE pairs), attn_v,
attn_output, ffn_norm, ffn_gate_inp (the router, float32) and the experts
stacked as ffn_gate_exps / ffn_up_exps / ffn_down_exps.

For Qwen3-MoE (model_type qwen3_moe): llama.cpp's "qwen3moe" architecture,
the same names plus attn_q_norm / attn_k_norm (per-head RMSNorm weights), q/k
rows unpermuted (qwen3moe uses NeoX RoPE, the Hugging Face order), the router
from mlp.gate, the experts from mlp.experts.E.{gate,up,down}_proj, and
qwen3moe.expert_feed_forward_length = moe_intermediate_size. llama.cpp's
qwen3moe always renormalises the top-k weights and has no dense layers, so a
checkpoint with norm_topk_prob false, mlp_only_layers or decoder_sparse_step
> 1 is refused.

Matrices keep their stored type (BF16 stays BF16), vectors become float32.
The vocabulary is a placeholder of the right size (<unk>, <s>, </s>, the 256
byte tokens, then filler pieces; the benchmark feeds token ids), or with
--vocab hf the checkpoint's own byte-level BPE tokenizer
(bench-offload-llama.sh feeds text). Only numpy and gguf are needed;
safetensors are read by hand (u64 header length, JSON header, data), tensors
are streamed to the file one at a time.
"""
import argparse
import json
import os
import struct

import numpy as np
import gguf


class Checkpoint:
    """The tensors of a checkpoint directory (single file or sharded), mapped."""

    def __init__(self, d):
        self.d = d
        idx = os.path.join(d, "model.safetensors.index.json")
        files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
        self.where = {}
        for fn in files:
            path = os.path.join(d, fn)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            for name, info in header.items():
                if name != "__metadata__":
                    self.where[name] = (path, 8 + n, info)
        self.maps = {}

    def get(self, name):
        """(numpy array, 'BF16' or 'F32') of one tensor; BF16 as uint16."""
        path, base, info = self.where[name]
        if path not in self.maps:
            self.maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        a, b = info["data_offsets"]
        raw = self.maps[path][base + a:base + b]
        dt = {"BF16": np.uint16, "F32": np.float32, "F16": np.float16}[info["dtype"]]
        return raw.view(dt).reshape(info["shape"]), info["dtype"]

    def has(self, name):
        return name in self.where


def to_f32(a, dt):
    """A tensor as float32 (BF16 widened exactly)."""
    if dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def permute_rope(w, n_heads):
    """Rows of q/k from rotate-half order (each head: first halves, then second
    halves) to interleaved pairs, as llama.cpp's llama RoPE expects."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--vocab", choices=["placeholder", "hf"], default="placeholder",
                    help="placeholder: V filler pieces (id input only); hf: the checkpoint's own byte-level BPE "
                         "tokenizer.json (Qwen2-style pre-tokenizer) so llama.cpp tokenizes text as the checkpoint does")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    mt = cfg.get("model_type")
    if mt not in ("mixtral", "qwen3_moe"):
        raise SystemExit(f"hf_to_gguf.py: model_type {mt!r}: only mixtral and qwen3_moe checkpoints")
    qwen3 = mt == "qwen3_moe"
    if qwen3 and (not cfg.get("norm_topk_prob", False) or cfg.get("mlp_only_layers")
                  or cfg.get("decoder_sparse_step", 1) != 1):
        raise SystemExit("hf_to_gguf.py: llama.cpp's qwen3moe renormalises the top-k weights and has no dense "
                         "layers: norm_topk_prob must be true, mlp_only_layers empty, decoder_sparse_step 1")
    H, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nh, nkv, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or H // nh
    E = cfg["num_experts"] if qwen3 and "num_experts" in cfg else cfg["num_local_experts"]
    K = cfg["num_experts_per_tok"]
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    ck = Checkpoint(a.model)
    arch = "qwen3moe" if qwen3 else "llama"

    # (name, producer, raw type): producers return numpy arrays in GGUF's row-major order
    plan = []
    mat_dt = ck.get("model.embed_tokens.weight")[1]

    # a producer has .shape and .dtype (read from the headers, nothing loaded)
    def matrix(hf_name, fix=None):
        def make():
            w, dt = ck.get(hf_name)
            return fix(w) if fix else w
        w0 = ck.get(hf_name)[0]
        make.shape, make.dtype = w0.shape, w0.dtype
        return make

    def vector(hf_name):
        make = lambda: to_f32(*ck.get(hf_name))
        make.shape, make.dtype = ck.get(hf_name)[0].shape, np.dtype(np.float32)
        return make

    def experts(kind, l):
        if qwen3:
            names = [f"model.layers.{l}.mlp.experts.{e}.{kind}.weight" for e in range(E)]
        else:
            names = [f"model.layers.{l}.block_sparse_moe.experts.{e}.{kind}.weight" for e in range(E)]
        missing = [n for n in names if not ck.has(n)]
        if missing:
            raise SystemExit(f"hf_to_gguf.py: no tensor {missing[0]} (only per-expert tensors are read, not the "
                             "fused experts.gate_up_proj layout)")
        make = lambda: np.stack([ck.get(n)[0] for n in names])
        w0 = ck.get(names[0])[0]
        make.shape, make.dtype = (E,) + tuple(w0.shape), w0.dtype
        return make

    raw = gguf.GGMLQuantizationType.BF16 if mat_dt == "BF16" else gguf.GGMLQuantizationType.F32
    plan.append(("token_embd.weight", matrix("model.embed_tokens.weight"), raw))
    plan.append(("output_norm.weight", vector("model.norm.weight"), None))
    if ck.has("lm_head.weight") and not cfg.get("tie_word_embeddings", False):
        plan.append(("output.weight", matrix("lm_head.weight"), raw))
    for l in range(L):
        p, q = f"model.layers.{l}.", f"blk.{l}."
        if qwen3:  # NeoX RoPE: q/k rows stay in the Hugging Face order
            plan += [
                (q + "attn_norm.weight", vector(p + "input_layernorm.weight"), None),
                (q + "attn_q.weight", matrix(p + "self_attn.q_proj.weight"), raw),
                (q + "attn_q_norm.weight", vector(p + "self_attn.q_norm.weight"), None),
                (q + "attn_k.weight", matrix(p + "self_attn.k_proj.weight"), raw),
                (q + "attn_k_norm.weight", vector(p + "self_attn.k_norm.weight"), None),
                (q + "attn_v.weight", matrix(p + "self_attn.v_proj.weight"), raw),
                (q + "attn_output.weight", matrix(p + "self_attn.o_proj.weight"), raw),
                (q + "ffn_norm.weight", vector(p + "post_attention_layernorm.weight"), None),
                (q + "ffn_gate_inp.weight", vector(p + "mlp.gate.weight"), None),
                (q + "ffn_gate_exps.weight", experts("gate_proj", l), raw),
                (q + "ffn_down_exps.weight", experts("down_proj", l), raw),
                (q + "ffn_up_exps.weight", experts("up_proj", l), raw),
            ]
            continue
        plan += [
            (q + "attn_norm.weight", vector(p + "input_layernorm.weight"), None),
            (q + "attn_q.weight", matrix(p + "self_attn.q_proj.weight", lambda w: permute_rope(w, nh)), raw),
            (q + "attn_k.weight", matrix(p + "self_attn.k_proj.weight", lambda w: permute_rope(w, nkv)), raw),
            (q + "attn_v.weight", matrix(p + "self_attn.v_proj.weight"), raw),
            (q + "attn_output.weight", matrix(p + "self_attn.o_proj.weight"), raw),
            (q + "ffn_norm.weight", vector(p + "post_attention_layernorm.weight"), None),
            (q + "ffn_gate_inp.weight", vector(p + "block_sparse_moe.gate.weight"), None),
            (q + "ffn_gate_exps.weight", experts("w1", l), raw),
            (q + "ffn_down_exps.weight", experts("w2", l), raw),
            (q + "ffn_up_exps.weight", experts("w3", l), raw),
        ]

    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(os.path.basename(os.path.normpath(a.model)))
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_expert_count(E)
    w.add_expert_used_count(K)
    if qwen3:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if raw == gguf.GGMLQuantizationType.BF16 else gguf.LlamaFileType.ALL_F32)
    if a.vocab == "hf":
        add_hf_vocab(w, a.model, V, cfg)
    else:
        add_placeholder_vocab(w, V)

    # tensor infos first (shapes from the headers), then the data streamed
    for name, make, rt in plan:
        nbytes = int(np.prod(make.shape)) * make.dtype.itemsize
        w.add_tensor_info(name, make.shape, make.dtype, nbytes, raw_dtype=rt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, make, rt in plan:
        t = np.ascontiguousarray(make())
        w.write_tensor_data(t)
        del t
    w.close()
    print(f"{a.out}: {os.path.getsize(a.out) / 1e9:.2f} GB")


def add_hf_vocab(w, model_dir, V, cfg):
    """The checkpoint's byte-level BPE vocabulary as llama.cpp's "gpt2" tokenizer
    model with the "qwen2" pre-tokenizer (the regex train_moe.py's tokenizer
    uses); ids past the tokenizer's vocabulary (vocab_size padding) become
    unused filler pieces."""
    tj = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    m = tj["model"]
    assert m["type"] == "BPE", "only byte-level BPE tokenizers"
    toks = [None] * V
    types = [gguf.TokenType.NORMAL] * V
    for piece, i in m["vocab"].items():
        if i < V:
            toks[i] = piece
    for t in tj.get("added_tokens", []):
        if t["id"] < V:
            toks[t["id"]] = t["content"]
            types[t["id"]] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    for i in range(V):
        if toks[i] is None:
            toks[i], types[i] = f"[PAD{i}]", gguf.TokenType.UNUSED
    merges = [" ".join(x) if isinstance(x, list) else x for x in m.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    bos, eos = cfg.get("bos_token_id"), cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    if bos is not None:
        w.add_bos_token_id(int(bos))
    if eos is not None:
        w.add_eos_token_id(int(eos))
    w.add_add_bos_token(False)


def add_placeholder_vocab(w, V):
    # placeholder SentencePiece-style vocabulary of V pieces
    toks, types = ["<unk>", "<s>", "</s>"], [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    toks += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    while len(toks) < V:
        toks.append(f"\u2581t{len(toks)}")
        types.append(gguf.TokenType.NORMAL)
    toks, types = toks[:V], types[:V]
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([-float(i) for i in range(V)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


if __name__ == "__main__":
    main()

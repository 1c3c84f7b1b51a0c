#!/usr/bin/env python3
"""Write tiny GGUF fixtures (tests/fixtures/gguf/) from the committed Hugging Face fixtures.

Each model GGUF holds the same weights as a Hugging Face fixture directory under
tests/fixtures/models/, laid out the way llama.cpp's convert_hf_to_gguf.py lays them out
(read from the llama-cpp-python 0.3.36 sdist, vendor/llama.cpp; the mapping is written
again here, nothing is copied):

  * metadata keys "{arch}.*" and "tokenizer.ggml.*" written with the `gguf` package;
  * tensor names from the `gguf` package's own TensorNameMap (the converter's table);
  * Mixtral (llama architecture): q_proj / k_proj rows permuted into llama.cpp's rope
    order; experts merged into ffn_{gate,up,down}_exps [E, rows, cols];
  * DeepSeek: kv_b_proj split into attn_k_b (transposed) and attn_v_b, as the
    converter has done since 2025; the correction bias as exp_probs_b.bias;
  * gpt-oss: the merged, transposed, interleaved gate_up_proj split into gate and up;
    MXFP4 blocks repacked from OpenAI's layout into ggml's;
  * F32 files keep every tensor in float32 (--outtype f32); the F16 file stores
    matrices as float16 and vectors and routers as float32, as the converter does.

Where llama.cpp's converter would lose a setting the tiny fixtures use (it hard-codes
the value in llama.cpp instead), the script writes the GGUF key that expresses it, so
the GGUF means the same model: expert_weights_norm (qwen2moe/qwen3moe/olmoe),
attention.sliding_window (Mixtral; llama.cpp's llama architecture has no window),
attention.clamp_kqv (OLMoE), swiglu_clamp_exp (gpt-oss's limit 1.2),
rope.scaling.yarn_attn_factor (DeepSeek-V3's mscale != mscale_all_dim) and
expert_gating_func (the transformers-5 DeepSeek configs have no scoring_func).
The Mixtral tokenizer is written as a SentencePiece ("llama") vocabulary with scores,
as a real Mixtral GGUF holds (the fixture has only a tokenizer.json, from which the
converter would give every piece the same score): a merged piece scores -(rank of
the merge that made it), other pieces -(n_merges + id), control and byte tokens 0.

It also writes:
  * mixtral-q4_k.gguf: a random Mixtral-shaped model with hidden and expert sizes of
    256 (k-quant blocks), experts in q4_k made by ggml's own quantize_row_q4_K_ref
    (compiled from the sdist, --ggml-src), other matrices q8_0 (gguf.quants), vectors
    f32; gpt_oss-q8_0.gguf from gpt_oss-f32 with every matrix q8_0;
  * tokenizers/<name>.gguf vocabulary-only files for four tokenizer fixtures and
    tokenizers/<name>.json with the ids the GGUF's tokenizer must give for every case
    text of tests/fixtures/tokenizers/<name>/cases.json, computed as llama.cpp would:
    gpt2 vocabularies by the `tokenizers` library configured as llama.cpp tokenizes
    (llama.cpp's pre-tokenizer regexes, no normalizer), llama vocabularies by a
    re-implementation of llama.cpp's SentencePiece merge loop (below). The script
    also reports how many cases give the same ids as the original tokenizer.json.

CI never runs this script; it reads the committed outputs. Run:

  pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/g
  tar xzf /tmp/g/llama_cpp_python-0.3.36.tar.gz -C /tmp/g
  python3 tests/oracle/make_gguf_fixtures.py \
      --ggml-src /tmp/g/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml

Needs numpy, gguf 0.19.0, safetensors, tokenizers (0.23 used) and a C compiler.
Deterministic: two runs write identical files.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_quant_fixtures import build_ggml, ggml_quantize  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
TOKS = ROOT / "tests" / "fixtures" / "tokenizers"
OUT = ROOT / "tests" / "fixtures" / "gguf"

TT = gguf.TokenType
A = gguf.MODEL_ARCH

# ---------------------------------------------------------------------------------------
# tokenizer metadata


def looks_special(t: str) -> bool:
    """The converter's does_token_look_special."""
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">")))


def hf_vocab(tokdir: Path, n_vocab: int | None):
    """Token texts and types in id order, padded with [PADi] (UNUSED) to n_vocab."""
    tj = json.loads((tokdir / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    added = tj.get("added_tokens", [])
    n = max(max(vocab.values()), max((a["id"] for a in added), default=-1)) + 1
    n = max(n, n_vocab or 0)
    texts = [f"[PAD{i}]" for i in range(n)]
    types = [TT.UNUSED] * n
    for t, i in vocab.items():
        texts[i], types[i] = t, TT.NORMAL
    for a in added:
        t = a["content"]
        if a.get("special") or looks_special(t):
            types[a["id"]] = TT.CONTROL
        else:
            t = t.replace("\u2581", " ")
            types[a["id"]] = TT.USER_DEFINED
        texts[a["id"]] = t
    return tj, texts, types


def spm_scores(tj: dict, texts: list[str], types: list):
    """SentencePiece-style scores for an HF byte-fallback BPE (see the module doc)."""
    merges = tj["model"]["merges"]
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    rank = {}
    for r, (a, b) in enumerate(pairs):
        rank.setdefault(a + b, r)
    scores, types = [], list(types)
    for i, t in enumerate(texts):
        if types[i] == TT.NORMAL and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types[i] = TT.BYTE
        if types[i] == TT.CONTROL and t == tj["model"].get("unk_token"):
            types[i] = TT.UNKNOWN
        if types[i] in (TT.CONTROL, TT.BYTE, TT.UNKNOWN):
            scores.append(0.0)
        elif types[i] == TT.UNUSED:
            scores.append(-1000.0)
        elif t in rank:
            scores.append(-float(rank[t]))
        else:
            scores.append(-float(len(pairs) + i))
    return scores, types


def write_vocab(w: gguf.GGUFWriter, tokdir: Path, kind: str, pre: str | None, n_vocab: int | None):
    """tokenizer.ggml.* for a tokenizer fixture; returns (texts, types, scores, meta)."""
    tj, texts, types = hf_vocab(tokdir, n_vocab)
    scores = None
    if kind == "llama":
        scores, types = spm_scores(tj, texts, types)
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
    w.add_token_list(texts)
    if scores is not None:
        w.add_token_scores(scores)
    w.add_token_types(types)
    sv = gguf.SpecialVocab(tokdir, load_merges=kind == "gpt2", n_vocab=len(texts))
    sv.add_to_gguf(w, quiet=True)
    meta = {"merges": sv.merges, "special": dict(sv.special_token_ids), "add_special": dict(sv.add_special_token)}
    return texts, types, scores, meta


# ---------------------------------------------------------------------------------------
# llama.cpp's tokenization, for the expected ids of the vocabulary-only GGUFs

LLAMACPP_RE = {  # llama.cpp's regexes for the pre-tokenizers used here
    "qwen2": ["(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
              " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "olmo": None,  # GPT-2's ByteLevel regex
}


def special_partition(text: str, texts, types, parse_special=True):
    """llama.cpp's tokenizer_st_partition: longest special token first, each split out
    of every remaining raw fragment, left to right. Returns [(is_token, str_or_id)]."""
    specials = [i for i, t in enumerate(types) if t in (TT.CONTROL, TT.USER_DEFINED, TT.UNKNOWN)]
    specials.sort(key=lambda i: -len(texts[i].encode()))  # stable: equal lengths keep id order
    frags = [(False, text)]
    for sid in specials:
        if not parse_special and types[sid] in (TT.CONTROL, TT.UNKNOWN):
            continue
        st = texts[sid]
        out = []
        for is_tok, f in frags:
            if is_tok:
                out.append((True, f))
                continue
            while True:
                k = f.find(st)
                if k < 0:
                    break
                if k > 0:
                    out.append((False, f[:k]))
                out.append((True, sid))
                f = f[k + len(st):]
            if f:
                out.append((False, f))
        frags = out
    return frags


def spm_tokenize(frag: str, tok2id: dict, scores):
    """llama.cpp's llm_tokenizer_spm_session: merge the adjacent pair whose concatenation
    is a token with the highest score (leftmost first on ties) until none is left; then
    symbols that are not tokens become their bytes."""
    sym = list(frag)  # UTF-8 characters
    prev = list(range(-1, len(sym) - 1))
    nxt = list(range(1, len(sym) + 1))
    nxt[-1:] = [-1] if sym else []
    heap = []

    def push(l, r):
        if l < 0 or r < 0:
            return
        t = sym[l] + sym[r]
        if t in tok2id:
            heapq.heappush(heap, (-scores[tok2id[t]], l, r, len(t)))

    for i in range(1, len(sym)):
        push(i - 1, i)
    while heap:
        _, l, r, size = heapq.heappop(heap)
        if not sym[l] or not sym[r] or len(sym[l]) + len(sym[r]) != size or nxt[l] != r:
            continue
        sym[l] += sym[r]
        sym[r] = ""
        nxt[l] = nxt[r]
        if nxt[r] >= 0:
            prev[nxt[r]] = l
        push(prev[l], l)
        push(l, nxt[l])
    out = []
    i = 0 if sym else -1
    while i >= 0:
        s = sym[i]
        if s in tok2id:
            out.append(tok2id[s])
        else:
            out.extend(tok2id["<0x%02X>" % b] for b in s.encode())
        i = nxt[i]
    return out


def llama_cpp_spm_ids(text, texts, types, scores, bos, add_bos, add_space_prefix=True):
    tok2id = {t: i for i, t in enumerate(texts)}
    ids = [bos] if add_bos else []
    prev_special = True
    for is_tok, f in special_partition(text, texts, types):
        if is_tok:
            ids.append(f)
            prev_special = True
            continue
        f = (" " if add_space_prefix and prev_special else "") + f
        ids += spm_tokenize(f.replace(" ", "\u2581"), tok2id, scores)
        prev_special = False
    return ids


def llama_cpp_bpe_tokenizer(texts, types, merges, pre):
    """A `tokenizers` Tokenizer that tokenizes as llama.cpp does a gpt2 GGUF vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, decoders
    vocab = {t: i for i, t in enumerate(texts)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, byte_fallback=False))
    if LLAMACPP_RE[pre] is None:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in LLAMACPP_RE[pre]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_tokens([AddedToken(texts[i], special=types[i] != TT.USER_DEFINED, normalized=False)
                   for i in range(len(texts)) if types[i] in (TT.CONTROL, TT.USER_DEFINED, TT.UNKNOWN)])
    return tk


TOKENIZER_GGUFS = [  # name, model, pre
    ("llama-spbpe", "llama", None),
    ("phi-spbpe", "llama", None),
    ("qwen-bytelevel", "gpt2", "qwen2"),
    ("neox-bytelevel", "gpt2", "olmo"),
]


def make_tokenizer_fixture(name, kind, pre, outdir: Path):
    tokdir = TOKS / name
    path = outdir / f"{name}.gguf"
    w = gguf.GGUFWriter(path, "llama")
    texts, types, scores, meta = write_vocab(w, tokdir, kind, pre, None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cases = json.loads((tokdir / "cases.json").read_text())
    bos = meta["special"].get("bos", -1)
    eos = meta["special"].get("eos", -1)
    add_bos = meta["add_special"].get("bos", kind == "llama")
    add_eos = meta["add_special"].get("eos", False)
    out, same = [], 0
    if kind == "gpt2":
        tk = llama_cpp_bpe_tokenizer(texts, types, meta["merges"], pre)
    for c in cases:
        if kind == "llama":
            ids = llama_cpp_spm_ids(c["text"], texts, types, scores, bos, add_bos)
        else:
            ids = ([bos] if add_bos else []) + tk.encode(c["text"], add_special_tokens=False).ids
        if add_eos:
            ids.append(eos)
        same += ids == c["ids"]
        out.append({"text": c["text"], "ids": ids, "same_as_tokenizer_json": ids == c["ids"]})
    (outdir / f"{name}.json").write_text("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in out) + "\n]\n")
    print(f"  tokenizers/{name}.gguf: {len(texts)} tokens, {kind}{'/' + pre if pre else ''}; "
          f"{same}/{len(cases)} cases give the tokenizer.json ids")


# ---------------------------------------------------------------------------------------
# model GGUFs


def load_hf(d: Path) -> dict:
    w = {}
    for f in sorted(d.glob("*.safetensors")):
        w.update(load_file(f))
    return w


def llama_permute(x: np.ndarray, heads: int) -> np.ndarray:
    """transformers' rotate-half row order -> llama.cpp's adjacent-pair order (rows)."""
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


class Emitter:
    """Collects (gguf name, array) in the converter's naming and typing."""

    def __init__(self, arch, n_layer, outtype):
        self.map = gguf.get_tensor_name_map(arch, n_layer)
        self.outtype = outtype
        self.items = []

    def name(self, hf: str) -> str:
        hf = hf.replace("e_score_correction_bias", "e_score_correction.bias")
        if hf.endswith(".sinks"):
            hf += ".weight"
        n = self.map.get_name(hf, try_suffixes=(".weight", ".bias"))
        if n is None:
            raise KeyError(f"no GGUF name for {hf}")
        return n

    def add(self, hf_or_gguf: str, x: np.ndarray, raw: bool = False, force_f32: bool = False):
        n = hf_or_gguf if raw else self.name(hf_or_gguf)
        x = np.ascontiguousarray(x)
        if (x.dtype == np.uint8 or self.outtype == "f32" or x.ndim <= 1 or force_f32 or "ffn_gate_inp" in n
                or n.endswith(".bias")):
            self.items.append((n, x.astype(np.float32) if x.dtype != np.uint8 else x, None))
        elif self.outtype == "f16":
            self.items.append((n, x.astype(np.float16), None))
        elif self.outtype == "q8_0":
            self.items.append((n, gguf.quants.quantize(x.astype(np.float32), QT.Q8_0), QT.Q8_0))
        else:
            raise ValueError(self.outtype)

    def add_quant(self, n: str, data: np.ndarray, qtype):
        """Quantized rows as bytes, shape [..., rows, row bytes]."""
        self.items.append((n, data, qtype))

    def write(self, w: gguf.GGUFWriter):
        for n, x, q in self.items:
            if q is not None:
                w.add_tensor(n, x, raw_dtype=q)
            else:
                w.add_tensor(n, x)


def merged_experts(W, prefix, n_exp, names):
    """Stack per-expert matrices of one layer: [E, rows, cols] for each of names."""
    return [np.stack([W[f"{prefix}.{e}.{n}.weight"] for e in range(n_exp)]) for n in names]


def common_keys(w: gguf.GGUFWriter, cfg: dict, n_layer: int, kv_heads: int | None = None):
    w.add_block_count(n_layer)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(kv_heads or cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    rp = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(rp.get("rope_theta", 10000.0))


def rope_yarn_keys(w, rp):
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rp["factor"])
    w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    if "beta_fast" in rp:
        w.add_rope_scaling_yarn_beta_fast(rp["beta_fast"])
    if "beta_slow" in rp:
        w.add_rope_scaling_yarn_beta_slow(rp["beta_slow"])


def yarn_mscale(scale, m):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def attn_common(em, W, p, cfg, permute=False):
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    for part in ("q_proj", "k_proj", "v_proj", "o_proj"):
        for sfx in ("weight", "bias"):
            k = f"{p}.self_attn.{part}.{sfx}"
            if k not in W:
                continue
            x = W[k]
            if permute and part == "q_proj":
                x = llama_permute(x, nh)
            if permute and part == "k_proj":
                x = llama_permute(x, nkv)
            em.add(k, x)
    for part in ("q_norm", "k_norm"):
        k = f"{p}.self_attn.{part}.weight"
        if k in W:
            em.add(k, W[k])
    for k in (f"{p}.input_layernorm.weight", f"{p}.input_layernorm.bias", f"{p}.post_attention_layernorm.weight",
              f"{p}.post_attention_layernorm.bias"):
        if k in W:
            em.add(k, W[k])


def top_level(em, W):
    em.add("model.embed_tokens.weight", W["model.embed_tokens.weight"])
    for k in ("model.norm.weight", "model.norm.bias", "lm_head.weight", "lm_head.bias"):
        if k in W:
            em.add(k, W[k])


def convert_mixtral(w, em, W, cfg):
    L = cfg["num_hidden_layers"]
    common_keys(w, cfg, L)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_rope_dimension_count(hd)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    top_level(em, W)
    for l in range(L):
        p = f"model.layers.{l}"
        attn_common(em, W, p, cfg, permute=True)
        em.add(f"{p}.block_sparse_moe.gate.weight", W[f"{p}.block_sparse_moe.gate.weight"])
        g, d, u = merged_experts(W, f"{p}.block_sparse_moe.experts", cfg["num_local_experts"], ["w1", "w2", "w3"])
        em.add(f"layers.{l}.feed_forward.experts.w1.weight", g)
        em.add(f"layers.{l}.feed_forward.experts.w2.weight", d)
        em.add(f"layers.{l}.feed_forward.experts.w3.weight", u)


def convert_qwen_moe(w, em, W, cfg, qwen3):
    L = cfg["num_hidden_layers"]
    common_keys(w, cfg, L)
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    if cfg.get("head_dim"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if not qwen3:
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", False)))
    top_level(em, W)
    for l in range(L):
        p = f"model.layers.{l}"
        attn_common(em, W, p, cfg)
        if f"{p}.mlp.gate.weight" not in W:  # a dense layer (mlp_only_layers): llama.cpp's qwen2moe and
            for part in ("gate", "up", "down"):  # qwen3moe have none, so the generic FFN names
                em.add(f"blk.{l}.ffn_{part}.weight", W[f"{p}.mlp.{part}_proj.weight"], raw=True)
            continue
        em.add(f"{p}.mlp.gate.weight", W[f"{p}.mlp.gate.weight"])
        d, g, u = merged_experts(W, f"{p}.mlp.experts", E, ["down_proj", "gate_proj", "up_proj"])
        em.add(f"{p}.mlp.experts.down_proj.weight", d)
        em.add(f"{p}.mlp.experts.gate_proj.weight", g)
        em.add(f"{p}.mlp.experts.up_proj.weight", u)
        if f"{p}.mlp.shared_expert.gate_proj.weight" in W:
            for part in ("gate_proj", "up_proj", "down_proj"):
                em.add(f"{p}.mlp.shared_expert.{part}.weight", W[f"{p}.mlp.shared_expert.{part}.weight"])
            em.add(f"{p}.mlp.shared_expert_gate.weight", W[f"{p}.mlp.shared_expert_gate.weight"])


def convert_olmoe(w, em, W, cfg):
    L = cfg["num_hidden_layers"]
    common_keys(w, cfg, L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", False)))
    if cfg.get("clip_qkv"):
        w.add_clamp_kqv(cfg["clip_qkv"])
    top_level(em, W)
    for l in range(L):
        p = f"model.layers.{l}"
        attn_common(em, W, p, cfg)
        em.add(f"{p}.mlp.gate.weight", W[f"{p}.mlp.gate.weight"])
        d, g, u = merged_experts(W, f"{p}.mlp.experts", cfg["num_experts"], ["down_proj", "gate_proj", "up_proj"])
        em.add(f"{p}.mlp.experts.down_proj.weight", d)
        em.add(f"{p}.mlp.experts.gate_proj.weight", g)
        em.add(f"{p}.mlp.experts.up_proj.weight", u)


def convert_phimoe(w, em, W, cfg):
    L = cfg["num_hidden_layers"]
    common_keys(w, cfg, L)
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    rp = cfg.get("rope_parameters") or {}
    w.add_rope_dimension_count(hd)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_sliding_window(cfg.get("sliding_window") or 0)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_count(cfg["num_local_experts"])
    if rp.get("long_factor"):
        omp = rp["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(omp)
        s = cfg["max_position_embeddings"] / omp
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(s) / math.log(omp)) if s > 1 else 1.0)
        em.add("rope_factors_long.weight", np.array(rp["long_factor"], np.float32), raw=True)
        em.add("rope_factors_short.weight", np.array(rp["short_factor"], np.float32), raw=True)
    top_level(em, W)
    for l in range(L):
        p = f"model.layers.{l}"
        attn_common(em, W, p, cfg)
        em.add(f"{p}.block_sparse_moe.gate.weight", W[f"{p}.block_sparse_moe.gate.weight"])
        g, d, u = merged_experts(W, f"{p}.block_sparse_moe.experts", cfg["num_local_experts"], ["w1", "w2", "w3"])
        em.add(f"model.layers.{l}.block_sparse_moe.experts.w1.weight", g)
        em.add(f"model.layers.{l}.block_sparse_moe.experts.w2.weight", d)
        em.add(f"model.layers.{l}.block_sparse_moe.experts.w3.weight", u)


def convert_deepseek(w, em, W, cfg, v3):
    L = cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    common_keys(w, cfg, L, kv_heads=1)  # the converter writes MLA as MQA (head_count_kv = 1)
    rp = cfg.get("rope_parameters") or {}
    rope, nope, vdim, r = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0))
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(r)
    w.add_key_length(r + rope)
    w.add_value_length(r)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(vdim)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
    if cfg.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    if cfg.get("n_group") is not None:
        w.add_expert_group_count(cfg["n_group"])
    if cfg.get("topk_group") is not None:
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_rope_dimension_count(rope)
    if rp.get("rope_type") == "yarn":
        rope_yarn_keys(w, rp)
        if rp.get("mscale_all_dim") is not None:
            w.add_rope_scaling_yarn_log_mul(0.1 * rp["mscale_all_dim"])
        if rp.get("mscale") and rp.get("mscale_all_dim") and rp["mscale"] != rp["mscale_all_dim"]:
            w.add_rope_scaling_yarn_attn_factor(yarn_mscale(rp["factor"], rp["mscale"]) /
                                                 yarn_mscale(rp["factor"], rp["mscale_all_dim"]))
    top_level(em, W)
    E = cfg["n_routed_experts"]
    for l in range(L):
        p = f"model.layers.{l}"
        for k in sorted(x for x in W if x.startswith(p + ".self_attn.") or x.startswith(p + ".input_layernorm")
                        or x.startswith(p + ".post_attention_layernorm")):
            if k.endswith("kv_b_proj.weight"):
                kv = W[k].reshape(nh, nope + vdim, r)
                em.add(k.replace("kv_b_proj", "k_b_proj"), kv[:, :nope, :].transpose(0, 2, 1))
                em.add(k.replace("kv_b_proj", "v_b_proj"), kv[:, nope:, :])
            else:
                em.add(k, W[k])
        if f"{p}.mlp.gate.weight" not in W:
            for part in ("gate_proj", "up_proj", "down_proj"):
                em.add(f"{p}.mlp.{part}.weight", W[f"{p}.mlp.{part}.weight"])
            continue
        em.add(f"{p}.mlp.gate.weight", W[f"{p}.mlp.gate.weight"])
        if f"{p}.mlp.gate.e_score_correction_bias" in W:
            em.add(f"{p}.mlp.gate.e_score_correction_bias", W[f"{p}.mlp.gate.e_score_correction_bias"])
        d, g, u = merged_experts(W, f"{p}.mlp.experts", E, ["down_proj", "gate_proj", "up_proj"])
        em.add(f"{p}.mlp.experts.down_proj.weight", d)
        em.add(f"{p}.mlp.experts.gate_proj.weight", g)
        em.add(f"{p}.mlp.experts.up_proj.weight", u)
        for part in ("gate_proj", "up_proj", "down_proj"):
            em.add(f"{p}.mlp.shared_experts.{part}.weight", W[f"{p}.mlp.shared_experts.{part}.weight"])


def mxfp4_ggml(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """OpenAI's MXFP4 (blocks [..., nb, 16]: byte j = element 2j low, 2j+1 high; scales
    [..., nb]) as ggml's mxfp4 rows ([..., nb * 17]: scale, then byte j = element j low,
    element j + 16 high). Codes and scales are kept."""
    q = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    packed = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)
    out = np.concatenate([scales[..., None], packed], axis=-1)
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * 17)


def convert_gpt_oss(w, em, W, cfg):
    L = cfg["num_hidden_layers"]
    common_keys(w, cfg, L)
    E, F, H = cfg["num_local_experts"], cfg["intermediate_size"], cfg["hidden_size"]
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_feed_forward_length(F)
    w.add_expert_feed_forward_length(F)
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_sliding_window(cfg["sliding_window"])
    if cfg.get("swiglu_limit", 7.0) != 7.0:
        w.add_swiglu_clamp_exp([float(cfg["swiglu_limit"])] * L)
    rp = cfg["rope_parameters"]
    rope_yarn_keys(w, rp)
    top_level(em, W)
    for l in range(L):
        p = f"model.layers.{l}"
        attn_common(em, W, p, cfg)
        em.add(f"{p}.self_attn.sinks", W[f"{p}.self_attn.sinks"])
        em.add(f"{p}.mlp.router.weight", W[f"{p}.mlp.router.weight"])
        em.add(f"{p}.mlp.router.bias", W[f"{p}.mlp.router.bias"])
        gub = W[f"{p}.mlp.experts.gate_up_proj_bias"]
        em.add(f"{p}.mlp.experts.gate_proj.bias", gub[:, ::2])
        em.add(f"{p}.mlp.experts.up_proj.bias", gub[:, 1::2])
        em.add(f"{p}.mlp.experts.down_proj.bias", W[f"{p}.mlp.experts.down_proj_bias"])
        if f"{p}.mlp.experts.gate_up_proj_blocks" in W:
            gb, gs = W[f"{p}.mlp.experts.gate_up_proj_blocks"], W[f"{p}.mlp.experts.gate_up_proj_scales"]
            db, ds = W[f"{p}.mlp.experts.down_proj_blocks"], W[f"{p}.mlp.experts.down_proj_scales"]
            em.add_quant(em.name(f"{p}.mlp.experts.gate_proj.weight"), mxfp4_ggml(gb[:, ::2], gs[:, ::2]), QT.MXFP4)
            em.add_quant(em.name(f"{p}.mlp.experts.up_proj.weight"), mxfp4_ggml(gb[:, 1::2], gs[:, 1::2]), QT.MXFP4)
            em.add_quant(em.name(f"{p}.mlp.experts.down_proj.weight"), mxfp4_ggml(db, ds), QT.MXFP4)
        else:
            gu = W[f"{p}.mlp.experts.gate_up_proj"].transpose(0, 2, 1)  # [E, 2F, H]
            em.add(f"{p}.mlp.experts.gate_proj.weight", gu[:, ::2])
            em.add(f"{p}.mlp.experts.up_proj.weight", gu[:, 1::2])
            em.add(f"{p}.mlp.experts.down_proj.weight", W[f"{p}.mlp.experts.down_proj"].transpose(0, 2, 1))


MODEL_GGUFS = [  # output name, HF fixture, gguf arch, tokenizer fixture, tokenizer kind, pre, outtype
    ("mixtral-f32", "mixtral-f32", A.LLAMA, "llama-spbpe", "llama", None, "f32"),
    ("mixtral-f16", "mixtral-f16", A.LLAMA, "llama-spbpe", "llama", None, "f16"),
    ("qwen2_moe-f32", "qwen2_moe-f32", A.QWEN2MOE, "qwen-bytelevel", "gpt2", "qwen2", "f32"),
    ("qwen3_moe-f32", "qwen3_moe-f32", A.QWEN3MOE, "qwen-bytelevel", "gpt2", "qwen2", "f32"),
    ("olmoe-f32", "olmoe-f32", A.OLMOE, "neox-bytelevel", "gpt2", "olmo", "f32"),
    ("phimoe-norope-f32", "phimoe-norope-f32", A.PHIMOE, "phi-spbpe", "llama", None, "f32"),
    ("deepseek_v2-f32", "deepseek_v2-f32", A.DEEPSEEK2, "qwen-bytelevel", "gpt2", "qwen2", "f32"),
    ("deepseek_v3-f32", "deepseek_v3-f32", A.DEEPSEEK2, "neox-bytelevel", "gpt2", "olmo", "f32"),
    ("gpt_oss-f32", "gpt_oss-f32", A.GPT_OSS, "qwen-bytelevel", "gpt2", "qwen2", "f32"),
    ("gpt_oss-mxfp4", "gpt_oss-mxfp4", A.GPT_OSS, "qwen-bytelevel", "gpt2", "qwen2", "f32"),
    ("gpt_oss-q8_0", "gpt_oss-f32", A.GPT_OSS, "qwen-bytelevel", "gpt2", "qwen2", "q8_0"),
]


def model_tokenizer_dir(hf: Path, tokname: str) -> Path:
    """The tokenizer files of a model fixture are those of a tokenizer fixture."""
    a = json.loads((hf / "tokenizer.json").read_text())
    b = json.loads((TOKS / tokname / "tokenizer.json").read_text())
    if a["model"]["vocab"] != b["model"]["vocab"]:
        raise SystemExit(f"{hf.name}: tokenizer is not {tokname}")
    return hf


def make_model_fixture(out, src, arch, tokname, kind, pre, outtype, outdir: Path):
    hf = MODELS / src
    cfg = json.loads((hf / "config.json").read_text())
    W = load_hf(hf)
    n_layer = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(outdir / f"{out}.gguf", gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(out)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype])
    em = Emitter(arch, n_layer, outtype)
    if arch == A.LLAMA:
        convert_mixtral(w, em, W, cfg)
    elif arch in (A.QWEN2MOE, A.QWEN3MOE):
        convert_qwen_moe(w, em, W, cfg, arch == A.QWEN3MOE)
    elif arch == A.OLMOE:
        convert_olmoe(w, em, W, cfg)
    elif arch == A.PHIMOE:
        convert_phimoe(w, em, W, cfg)
    elif arch == A.DEEPSEEK2:
        convert_deepseek(w, em, W, cfg, cfg["architectures"][0] == "DeepseekV3ForCausalLM")
    elif arch == A.GPT_OSS:
        convert_gpt_oss(w, em, W, cfg)
    write_vocab(w, model_tokenizer_dir(hf, tokname), kind, pre, cfg["vocab_size"])
    em.write(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = (outdir / f"{out}.gguf").stat().st_size
    print(f"  {out}.gguf: {len(em.items)} tensors, {size / 1e6:.2f} MB (from models/{src})")


def make_q4k_fixture(lib, outdir: Path):
    """A random Mixtral-shaped model whose experts are q4_k blocks made by ggml."""
    H, F, E, L, NH, NKV, V = 256, 256, 4, 1, 4, 2, 1024
    hd = H // NH
    rng = np.random.default_rng(4242)

    def mat(r, c, s=0.08):
        return (rng.standard_normal((r, c)) * s).astype(np.float32)

    w = gguf.GGUFWriter(outdir / "mixtral-q4_k.gguf", "llama")
    w.add_name("mixtral-q4_k")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_S)
    cfg = {"max_position_embeddings": 256, "hidden_size": H, "num_attention_heads": NH, "num_key_value_heads": NKV,
           "rms_norm_eps": 1e-5, "vocab_size": V, "rope_parameters": {"rope_theta": 1e6}}
    common_keys(w, cfg, L)
    w.add_rope_dimension_count(hd)
    w.add_feed_forward_length(F)
    w.add_expert_count(E)
    w.add_expert_used_count(2)

    def q8(n, x):
        w.add_tensor(n, gguf.quants.quantize(x, QT.Q8_0), raw_dtype=QT.Q8_0)

    def q4k(n, x):  # x [E, rows, cols]
        q = np.stack([ggml_quantize(lib, QT.Q4_K, row) for row in x.reshape(-1, x.shape[-1])])
        w.add_tensor(n, q.reshape(*x.shape[:-1], q.shape[-1]), raw_dtype=QT.Q4_K)

    q8("token_embd.weight", mat(V, H, 1.0))
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    q8("output.weight", mat(V, H))
    for l in range(L):
        w.add_tensor(f"blk.{l}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
        w.add_tensor(f"blk.{l}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
        q8(f"blk.{l}.attn_q.weight", mat(NH * hd, H))
        q8(f"blk.{l}.attn_k.weight", mat(NKV * hd, H))
        q8(f"blk.{l}.attn_v.weight", mat(NKV * hd, H))
        q8(f"blk.{l}.attn_output.weight", mat(H, NH * hd))
        w.add_tensor(f"blk.{l}.ffn_gate_inp.weight", mat(E, H, 0.5))
        q4k(f"blk.{l}.ffn_gate_exps.weight", np.stack([mat(F, H) for _ in range(E)]))
        q4k(f"blk.{l}.ffn_up_exps.weight", np.stack([mat(F, H) for _ in range(E)]))
        q4k(f"blk.{l}.ffn_down_exps.weight", np.stack([mat(H, F) for _ in range(E)]))
    write_vocab(w, TOKS / "llama-spbpe", "llama", None, V)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"  mixtral-q4_k.gguf: {(outdir / 'mixtral-q4_k.gguf').stat().st_size / 1e6:.2f} MB (random, q4_k experts)")


def write_fuzz_seeds(outdir: Path):
    """Small valid GGUFs of each kind the translation reads: the seed corpus of
    tests/fuzz/fuzz-gguf.c (replayed by ctest)."""
    outdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)

    def f32(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    def spm_vocab(w):
        w.add_tokenizer_model("llama")
        w.add_token_list(["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "ab"])
        w.add_token_scores([0, 0, 0, -5, -6, -7, -1, -2])
        w.add_token_types([2, 3, 3, 1, 1, 1, 1, 1])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)

    def done(w):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    H, F, E, V = 8, 8, 2, 8
    # llama MoE (Mixtral), two layers, merged experts
    w = gguf.GGUFWriter(outdir / "seed-mixtral.gguf", "llama")
    for k, v in (("block_count", 2), ("embedding_length", H), ("feed_forward_length", F), ("expert_count", E),
                 ("expert_used_count", 1), ("context_length", 32)):
        w.add_uint32(f"llama.{k}", v)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    spm_vocab(w)
    w.add_tensor("token_embd.weight", f32(V, H))
    w.add_tensor("output_norm.weight", f32(H))
    for l in range(2):
        for n, s in (("attn_norm", (H,)), ("ffn_norm", (H,)), ("attn_q", (H, H)), ("attn_k", (4, H)),
                     ("attn_v", (4, H)), ("attn_output", (H, H)), ("ffn_gate_inp", (E, H)),
                     ("ffn_gate_exps", (E, F, H)), ("ffn_up_exps", (E, F, H)), ("ffn_down_exps", (E, H, F))):
            w.add_tensor(f"blk.{l}.{n}.weight", f32(*s))
    done(w)
    # deepseek2 (V3 gating), a dense first layer, k_b / v_b, correction bias, shared expert
    w = gguf.GGUFWriter(outdir / "seed-deepseek2.gguf", "deepseek2")
    for k, v in (("block_count", 2), ("embedding_length", H), ("feed_forward_length", F), ("expert_count", 4),
                 ("expert_used_count", 2), ("context_length", 32), ("leading_dense_block_count", 1),
                 ("attention.kv_lora_rank", 4), ("attention.key_length", 6), ("attention.value_length", 4),
                 ("attention.key_length_mla", 6), ("attention.value_length_mla", 4), ("rope.dimension_count", 2),
                 ("expert_feed_forward_length", F), ("expert_shared_count", 1), ("expert_group_count", 2),
                 ("expert_group_used_count", 1), ("expert_gating_func", 2)):
        w.add_uint32(f"deepseek2.{k}", v)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_weights_scale(2.5)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(8)
    w.add_rope_scaling_yarn_log_mul(0.1)
    spm_vocab(w)
    w.add_tensor("token_embd.weight", f32(V, H))
    w.add_tensor("output_norm.weight", f32(H))
    w.add_tensor("output.weight", f32(V, H))
    for l in range(2):
        for n, s in (("attn_norm", (H,)), ("ffn_norm", (H,)), ("attn_q", (2 * 6, H)), ("attn_kv_a_mqa", (4 + 2, H)),
                     ("attn_kv_a_norm", (4,)), ("attn_k_b", (2, 4, 4)), ("attn_v_b", (2, 4, 4)),
                     ("attn_output", (H, 2 * 4))):
            w.add_tensor(f"blk.{l}.{n}.weight", f32(*s))
        if l == 0:
            for n, s in (("ffn_gate", (F, H)), ("ffn_up", (F, H)), ("ffn_down", (H, F))):
                w.add_tensor(f"blk.{l}.{n}.weight", f32(*s))
            continue
        for n, s in (("ffn_gate_inp", (4, H)), ("ffn_gate_exps", (4, F, H)), ("ffn_up_exps", (4, F, H)),
                     ("ffn_down_exps", (4, H, F)), ("ffn_gate_shexp", (F, H)), ("ffn_up_shexp", (F, H)),
                     ("ffn_down_shexp", (H, F))):
            w.add_tensor(f"blk.{l}.{n}.weight", f32(*s))
        w.add_tensor(f"blk.{l}.exp_probs_b.bias", f32(4))
    done(w)
    # gpt-oss with MXFP4 experts, biases and sinks; a gpt2 vocabulary
    H2 = 32
    w = gguf.GGUFWriter(outdir / "seed-gpt-oss.gguf", "gpt-oss")
    for k, v in (("block_count", 1), ("embedding_length", H2), ("expert_feed_forward_length", H2),
                 ("expert_count", E), ("expert_used_count", 1), ("context_length", 32), ("attention.key_length", 16),
                 ("attention.value_length", 16), ("attention.sliding_window", 4)):
        w.add_uint32(f"gpt-oss.{k}", v)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(["a", "b", "ab", "\u0120", "\u0120a", "<|endoftext|>", "c", "d"])
    w.add_token_types([1, 1, 1, 1, 1, 3, 1, 1])
    w.add_token_merges(["a b", "\u0120 a"])
    w.add_eos_token_id(5)
    w.add_tensor("token_embd.weight", f32(V, H2))
    w.add_tensor("output_norm.weight", f32(H2))
    w.add_tensor("output.weight", f32(V, H2))
    for n, s in (("attn_norm", (H2,)), ("post_attention_norm", (H2,)), ("attn_q", (32, H2)), ("attn_k", (16, H2)),
                 ("attn_v", (16, H2)), ("attn_output", (H2, 32)), ("attn_sinks", (2,)), ("ffn_gate_inp", (E, H2))):
        w.add_tensor(f"blk.0.{n}.weight", f32(*s))
    for n, s in (("attn_q", 32), ("attn_k", 16), ("attn_v", 16), ("attn_output", H2), ("ffn_gate_inp", E)):
        w.add_tensor(f"blk.0.{n}.bias", f32(s))
    for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        w.add_tensor(f"blk.0.{n}.weight", gguf.quants.quantize(f32(E, H2, H2), QT.MXFP4), raw_dtype=QT.MXFP4)
        w.add_tensor(f"blk.0.{n}.bias", f32(E, H2))
    done(w)
    seed = (outdir / "seed-mixtral.gguf").read_bytes()  # and two refused ones
    (outdir / "bad-truncated.gguf").write_bytes(seed[:700])
    (outdir / "bad-tensor-past-end.gguf").write_bytes(seed[:-40])
    print(f"  fuzz seeds: {sorted(p.name for p in outdir.iterdir())}")


LLAMA_CPP_WRAPPER = """
import os, sys, runpy
lc, pre = sys.argv.pop(1), sys.argv.pop(1)
sys.path[:0] = [sys.argv.pop(1), lc, os.path.join(lc, "gguf-py")]
os.chdir(lc)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tok: pre  # the fixtures' tokenizers have no registered hash
sys.argv[0] = os.path.join(lc, "convert_hf_to_gguf.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def compare_with_llama_cpp(lc: Path, outdir: Path):
    """Convert the HF fixtures with llama.cpp's own convert_hf_to_gguf.py and compare
    its files with ours: the same tensors (names, types, bytes), and which keys differ.
    Needs torch and transformers; a stub stands in for sentencepiece (the fixtures
    have no tokenizer.model, so the converter falls back to tokenizer.json)."""
    import subprocess
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="lc-convert-"))
    (tmp / "sentencepiece.py").write_text("class SentencePieceProcessor:\n    pass\n")
    (tmp / "wrapper.py").write_text(LLAMA_CPP_WRAPPER)
    print("llama.cpp's converter on the same fixtures:")
    for out, src, arch, tokname, kind, pre, outtype in MODEL_GGUFS:
        if outtype not in ("f32", "f16"):
            continue
        dst = tmp / f"{out}.gguf"
        r = subprocess.run([sys.executable, str(tmp / "wrapper.py"), str(lc), pre or "default", str(tmp),
                            str(MODELS / src), "--outfile", str(dst), "--outtype", outtype],
                           capture_output=True, text=True)
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            print(f"  {out}: llama.cpp's converter fails: {last}")
            continue
        a, b = gguf.GGUFReader(outdir / f"{out}.gguf"), gguf.GGUFReader(dst)
        ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
        same = set(ta) == set(tb) and all(ta[n].tensor_type == tb[n].tensor_type and
                                          np.array_equal(np.asarray(ta[n].data), np.asarray(tb[n].data)) for n in ta)
        ka = {k: f.contents() for k, f in a.fields.items() if not k.startswith(("GGUF.", "general.", "tokenizer."))}
        kb = {k: f.contents() for k, f in b.fields.items() if not k.startswith(("GGUF.", "general.", "tokenizer."))}
        diff = sorted(k for k in set(ka) | set(kb) if ka.get(k) != kb.get(k))
        print(f"  {out}: tensors {'identical' if same else 'DIFFERENT'} ({len(ta)}); keys only here or different: "
              + (", ".join(f"{k.split('.', 1)[1]}={ka.get(k)!r}" for k in diff) or "none"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ggml-src", required=True, help="ggml/ of llama.cpp (for quantize_row_q4_K_ref)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--fuzz-out", default=str(ROOT / "tests" / "fuzz" / "corpus" / "gguf"))
    ap.add_argument("--llama-cpp", help="vendor/llama.cpp of the sdist: also run its convert_hf_to_gguf.py on "
                    "the fixtures and compare (needs torch and transformers)")
    a = ap.parse_args()
    out = Path(a.out)
    (out / "tokenizers").mkdir(parents=True, exist_ok=True)
    print(f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else '?'}, numpy {np.__version__}")
    for spec in MODEL_GGUFS:
        make_model_fixture(*spec, out)
    make_q4k_fixture(build_ggml(a.ggml_src), out)
    for name, kind, pre in TOKENIZER_GGUFS:
        make_tokenizer_fixture(name, kind, pre, out / "tokenizers")
    write_fuzz_seeds(Path(a.fuzz_out))
    if a.llama_cpp:
        compare_with_llama_cpp(Path(a.llama_cpp), out)


if __name__ == "__main__":
    main()

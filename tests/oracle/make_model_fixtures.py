#!/usr/bin/env python3
"""Generate tiny random-initialised MoE checkpoints and Hugging Face oracle logits.

For every architecture in ``ARCHS`` and every dtype variant (f32, bf16), and for every entry of
``EXTRA_VARIANTS`` (f16 storage, sliding window, tied embeddings, biases, ...), this script

  1. builds a tiny model with transformers' own config/model classes,
  2. overwrites all parameters with a deterministic, deliberately "loud" init
     (so that logits are spread out and greedy decoding is not fragile),
  3. saves it with ``save_pretrained`` (safetensors, HF on-disk tensor names),
  4. loads it back with ``from_pretrained(dir, dtype=torch.float32,
     attn_implementation="eager", experts_implementation="eager")`` and records
       - prefill logits for every prompt position,
       - 16 greedy tokens decoded through the KV cache and the logits of each
         cached decode step,
     into ``<model dir>/oracle/``,
  5. cross-checks the oracle: no-cache prefill, full recompute of the whole
     sequence, ``model.generate``, and a longer cached decode must all agree;
     greedy margins and router decision gaps must be comfortably non-zero
     (otherwise the model is re-seeded).

Extra variants may also rewrite the saved file as a pre-quantized release does (gpt_oss-mxfp4: MXFP4 experts;
deepseek_v3-fp8: block-scaled FP8 weights, which needs the `accelerate` package for transformers' FP8 loader);
their oracle is transformers dequantizing the file on load.

Outputs go to tests/fixtures/models/<arch>-<f32|bf16>/ and tests/fixtures/models/<extra name>/.
See tests/oracle/README.md for the file formats and per-architecture notes.

Usage:  python3 tests/oracle/make_model_fixtures.py [--set all|base|extra] [--only NAME ...]
                                                    [--prompt-source auto|random]
CI never runs this script; it only reads the committed outputs.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

import transformers
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    DynamicCache,
    GenerationConfig,
    GptOssConfig,
    GptOssForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    PhimoeConfig,
    PhimoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

REPO = Path(__file__).resolve().parents[2]
OUT_ROOT = REPO / "tests" / "fixtures" / "models"
TOK_ROOT = REPO / "tests" / "fixtures" / "tokenizers"

VOCAB = 1024
TOKEN_ID_LIMIT = 1000  # tokenizers have <= 1000 ids; prompts and greedy ids stay below this
N_GENERATE = 16
N_LONG_EXTRA = 48  # extra cached decode steps for the (non-saved) long self-check
MIN_MARGIN = 2e-3  # required top1-top2 logit margin at every greedy step (brief: > 1e-4)
MIN_ROUTER_GAP = 1e-3  # required distance of every routing decision from its tie point
MAX_SEED_TRIES = 25
NP_REF_TOL = 5e-5  # float64 NumPy reference vs transformers' float32 logits (observed <= 1.5e-5)
MIN_DISTINCT_GREEDY = 10  # greedy must not collapse into repeating one or two tokens
MAX_DIR_BYTES = 2 * 1024 * 1024
SOFT_DIR_BYTES = 1024 * 1024 + 512 * 1024

# A sentence used when a tokenizer fixture is available (words appended until long enough).
PROMPT_WORDS = (
    "The quick brown fox jumps over the lazy dog while seven wizards quietly hum "
    "their favourite tunes near the old stone bridge at dawn and the river keeps "
    "running toward the distant grey sea beyond every hill"
).split()


# --------------------------------------------------------------------------------------
# Architecture specifications
# --------------------------------------------------------------------------------------


def phimoe_rope(head_dim: int) -> dict:
    n = head_dim // 2
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        # short_factor IS used by transformers 5.23 (for every position, see README);
        # make it non-trivial so that the C side has to apply it.
        "short_factor": [round(1.0 + 0.15 * i, 4) for i in range(n)],
        # long_factor is dead in transformers 5.23's PhimoeRotaryEmbedding.forward;
        # distinct values so that accidentally using it is detected.
        "long_factor": [round(1.5 + 0.75 * i, 4) for i in range(n)],
        "short_mscale": 1.1,
        "long_mscale": 1.25,
        "original_max_position_embeddings": 16,
    }


ARCHS: dict[str, dict] = {
    "mixtral": dict(
        config_cls=MixtralConfig,
        model_cls=MixtralForCausalLM,
        tokenizer="llama-spbpe",
        special_tokens={"bos": ("<s>", 1), "eos": ("</s>", 2)},
        router_kind="softmax_topk_renorm",
        prompt_len=22,
        seed=1101,
        config=dict(
            vocab_size=VOCAB,
            hidden_size=56,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            num_local_experts=8,
            num_experts_per_tok=2,
            rms_norm_eps=1e-5,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
        ),
        variants={"f32": {}, "bf16": {}},
        notes=(
            "Mixtral: RMSNorm, GQA with num_key_value_heads=1 (MQA, head_dim=14), default RoPE theta=1e6 "
            "(rotate_half / non-interleaved), 8 experts top-2, softmax over all router logits, top-k, "
            "renormalise the k probs to sum 1 (always, no config flag). Expert = w2(silu(w1 x) * w3 x)."
        ),
    ),
    "qwen2_moe": dict(
        config_cls=Qwen2MoeConfig,
        model_cls=Qwen2MoeForCausalLM,
        tokenizer="qwen-bytelevel",
        special_tokens={"bos": (None, None), "eos": ("<|endoftext|>", None)},
        router_kind="softmax_topk",
        prompt_len=20,
        seed=2202,
        config=dict(
            vocab_size=VOCAB,
            hidden_size=48,
            intermediate_size=80,  # dense MLP layers
            moe_intermediate_size=32,  # routed experts
            shared_expert_intermediate_size=72,  # shared expert
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            num_experts=6,
            num_experts_per_tok=3,
            qkv_bias=True,
            rms_norm_eps=1e-6,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False,
            tie_word_embeddings=False,
        ),
        variants={
            # f32: norm_topk_prob=True, layer 1 dense via mlp_only_layers, sharded checkpoint.
            "f32": dict(norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1),
            # bf16: norm_topk_prob=False, decoder_sparse_step=2 -> layers 0 and 2 dense, layer 1 sparse.
            "bf16": dict(norm_topk_prob=False, mlp_only_layers=[], decoder_sparse_step=2),
        },
        shard={"f32": "400KB"},
        notes=(
            "Qwen2-MoE: q/k/v bias (qkv_bias=True; o_proj has no bias), GQA 6/2 (head_dim=8), RMSNorm eps 1e-6, "
            "RoPE theta=1e6. Sparse block = routed experts (softmax over 6, top-3, renormalised only if "
            "norm_topk_prob) + sigmoid(shared_expert_gate(x)) * shared_expert(x). A layer i is sparse iff "
            "i not in mlp_only_layers and (i+1) % decoder_sparse_step == 0; otherwise it is a dense "
            "Qwen2MoeMLP with intermediate_size."
        ),
    ),
    "qwen3_moe": dict(
        config_cls=Qwen3MoeConfig,
        model_cls=Qwen3MoeForCausalLM,
        tokenizer="qwen-bytelevel",
        special_tokens={"bos": (None, None), "eos": ("<|endoftext|>", None)},
        router_kind="softmax_topk",
        prompt_len=21,
        seed=3303,
        config=dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=64,  # unused (no dense layers)
            moe_intermediate_size=36,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,  # != hidden_size / num_attention_heads (= 16)
            num_experts=6,
            num_experts_per_tok=3,
            norm_topk_prob=True,
            attention_bias=False,
            rms_norm_eps=1e-6,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
        ),
        variants={"f32": {}, "bf16": {}},
        notes=(
            "Qwen3-MoE: explicit head_dim=24 (hidden 64 / 4 heads would give 16) -> q_proj [96,64], k/v_proj "
            "[48,64], o_proj [64,96]; per-head RMSNorm q_norm/k_norm of size head_dim applied after the "
            "projection and before RoPE; no attention bias; softmax over 6 experts, top-3, renormalised "
            "(norm_topk_prob=True); no shared expert."
        ),
    ),
    "olmoe": dict(
        config_cls=OlmoeConfig,
        model_cls=OlmoeForCausalLM,
        tokenizer="neox-bytelevel",
        special_tokens={"bos": (None, None), "eos": ("<|endoftext|>", None)},
        router_kind="softmax_topk",
        prompt_len=23,
        seed=4404,
        config=dict(
            vocab_size=VOCAB,
            hidden_size=72,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=3,
            num_experts=5,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            rms_norm_eps=1e-5,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            pad_token_id=None,
            tie_word_embeddings=False,
        ),
        variants={"f32": dict(clip_qkv=1.5), "bf16": dict(clip_qkv=None)},
        notes=(
            "OLMoE: q_norm is an RMSNorm over the WHOLE q projection (size hidden=72), k_norm over the whole "
            "k projection (size (hidden/heads)*kv_heads=36), applied before reshaping to heads and before "
            "RoPE; then (if clip_qkv) q, k AND v are clamped to [-clip_qkv, clip_qkv] (after the norms, "
            "before RoPE). GQA 6/3 (head_dim=12), RoPE theta=1e4, softmax over 5 experts, top-2, NOT "
            "renormalised (norm_topk_prob=False)."
        ),
    ),
    "phimoe": dict(
        config_cls=PhimoeConfig,
        model_cls=PhimoeForCausalLM,
        tokenizer="phi-spbpe",
        # phi-spbpe's tokenizer_config says eos_token = <|endoftext|> (like real Phi-3.5-MoE, whose
        # eos_token_id 32000 is <|endoftext|>); id 2 (</s>) is only the fallback without tokenizer.
        special_tokens={"bos": ("<s>", 1), "eos": ("<|endoftext|>", 2)},
        router_kind="sparsemixer",
        prompt_len=24,
        seed=5505,
        config=dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            rms_norm_eps=1e-5,  # used as the LayerNorm eps
            max_position_embeddings=128,
            rope_parameters=phimoe_rope(16),
            attention_bias=True,
            lm_head_bias=True,
            router_jitter_noise=0.1,  # used at inference as the sparsemixer eps (real Phi-3.5-MoE: 0.01)
            input_jitter_noise=0.0,
            tie_word_embeddings=False,
        ),
        variants={"f32": {}, "bf16": {}},
        notes=(
            "PhiMoE: nn.LayerNorm (weight+bias, eps=rms_norm_eps) everywhere incl. final norm; q/k/v/o all "
            "with bias (attention_bias=True); lm_head with bias; sparsemixer top-2 routing with "
            "eps=router_jitter_noise=0.1 (see README); longrope with original_max_position_embeddings=16: "
            "inv_freq always uses short_factor, cos/sin scaled by long_mscale=1.25 when "
            "max(position_ids)+1 > 16 in the current forward call, else short_mscale=1.1. The main prompt "
            "(24 tokens) is entirely in the long-mscale regime (prefill and every decode step)."
        ),
    ),
    "deepseek_v2": dict(
        config_cls=DeepseekV2Config,
        model_cls=DeepseekV2ForCausalLM,
        tokenizer="qwen-bytelevel",
        special_tokens={"bos": (None, None), "eos": ("<|endoftext|>", None)},
        router_kind="softmax_topk",
        prompt_len=21,
        seed=6606,
        config=dict(
            vocab_size=VOCAB,
            hidden_size=48,
            intermediate_size=64,  # dense layers (first_k_dense_replace)
            moe_intermediate_size=24,  # routed experts; shared = 24 x n_shared_experts
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,  # MLA expands the latent to every head
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=1,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=10,
            routed_scaling_factor=1.5,
            rms_norm_eps=1e-6,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
        ),
        variants={
            # f32: no q LoRA, group-limited greedy routing (4 groups of 2, best 2 groups), layer 0 dense.
            "f32": dict(
                q_lora_rank=None, topk_method="group_limited_greedy", n_group=4, topk_group=2, first_k_dense_replace=1
            ),
            # bf16: q LoRA (rank 24), greedy routing, every layer sparse, 2 shared experts, attention biases.
            "bf16": dict(
                q_lora_rank=24,
                topk_method="greedy",
                first_k_dense_replace=0,
                n_shared_experts=2,
                routed_scaling_factor=1.0,
                attention_bias=True,
            ),
        },
        notes=(
            "DeepSeek-V2: multi-head latent attention: q = q_proj(x) (q_lora_rank null) or "
            "q_b_proj(RMSNorm_eps1e-6(q_a_proj(x))); kv_a_proj_with_mqa(x) = [latent (kv_lora_rank) | k_rope "
            "(qk_rope_head_dim)], the latent goes through kv_a_layernorm (eps 1e-6, NOT rms_norm_eps) and "
            "kv_b_proj to per-head [k_nope (qk_nope_head_dim) | v (v_head_dim)]; one k_rope shared by all "
            "heads; RoPE on q_rope and k_rope as complex multiplication of ADJACENT pairs (x0,x1),(x2,x3)...; "
            "scores (q_nope.k_nope + q_rope.k_rope) * (nope+rope)^-0.5. Router: softmax over 8 experts; greedy "
            "top-3, or group_limited_greedy (groups of 2, the topk_group groups with the largest max prob, "
            "others masked to 0); weights = probs x routed_scaling_factor, never renormalised (transformers "
            "ignores norm_topk_prob for V2). Shared experts (moe_intermediate_size x n_shared_experts) added "
            "ungated. Layers < first_k_dense_replace are a dense SwiGLU MLP (intermediate_size)."
        ),
    ),
    "deepseek_v3": dict(
        config_cls=DeepseekV3Config,
        model_cls=DeepseekV3ForCausalLM,
        tokenizer="neox-bytelevel",
        special_tokens={"bos": (None, None), "eos": ("<|endoftext|>", None)},
        router_kind="softmax_topk",  # group gaps are measured by the recorder
        prompt_len=22,
        seed=7707,
        config=dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=80,
            moe_intermediate_size=24,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_nope_head_dim=12,
            qk_rope_head_dim=8,
            v_head_dim=12,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            first_k_dense_replace=1,
            rms_norm_eps=1e-6,
            max_position_embeddings=256,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 0.8,
            },
            rope_interleave=True,
            num_mtp_layers=0,
            tie_word_embeddings=False,
        ),
        variants={
            # f32: as the base config (q LoRA, YaRN, interleaved RoPE, 4 groups / best 2, renormalised x 2.5).
            "f32": {},
            # bf16: no q LoRA, default RoPE in the rotate_half layout, 2 groups / best 1, no renormalisation.
            "bf16": dict(
                q_lora_rank=None,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                rope_interleave=False,
                n_group=2,
                topk_group=1,
                norm_topk_prob=False,
            ),
        },
        notes=(
            "DeepSeek-V3: the attention of DeepSeek-V2 (see deepseek_v2) with rope_interleave (default true: "
            "adjacent pairs, as V2) or rotate_half halves; YaRN RoPE over qk_rope_head_dim (factor 4, original "
            "context 64, beta 32/1, mscale 1.0 / mscale_all_dim 0.8: cos/sin x attention_factor = "
            "get_mscale(4,1)/get_mscale(4,0.8), and the softmax scale x get_mscale(4,0.8)^2). Router: scores = "
            "sigmoid(logits); choice = scores + e_score_correction_bias (a buffer, non-zero here); groups "
            "(n_group) ranked by the sum of their two best choice scores, the best topk_group kept, top-k of the "
            "choice among them; weights = scores of the chosen (renormalised with +1e-20 if norm_topk_prob) x "
            "routed_scaling_factor. Shared expert ungated. First first_k_dense_replace layers dense."
        ),
    ),
    "gpt_oss": dict(
        config_cls=GptOssConfig,
        model_cls=GptOssForCausalLM,
        tokenizer="qwen-bytelevel",
        special_tokens={"bos": (None, None), "eos": ("<|endoftext|>", None)},
        router_kind="softmax_topk",
        prompt_len=22,
        seed=8808,
        config=dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=32,
            head_dim=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=6,
            num_experts_per_tok=2,
            sliding_window=6,  # layer_types derived: layers 0 and 2 slide, layer 1 full
            attention_bias=True,
            rms_norm_eps=1e-5,
            max_position_embeddings=256,
            tie_word_embeddings=False,
        ),
        variants={
            # f32: YaRN without truncation (as the real gpt-oss), a tight SwiGLU clamp so it bites.
            "f32": dict(
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 150000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": 64,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "truncate": False,
                },
                swiglu_limit=1.2,
                swiglu_alpha=1.702,
            ),
            # bf16: default RoPE, the real clamp (7.0), another alpha.
            "bf16": dict(
                rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
                swiglu_limit=7.0,
                swiglu_alpha=1.5,
            ),
        },
        notes=(
            "gpt-oss: RMSNorm (eps 1e-5); attention with q/k/v/o biases, GQA 4/2 (head_dim 16), RoPE in halves "
            "(rotate_half), a learned per-head sink logit (self_attn.sinks) joining every softmax without a value, "
            "sliding window 6 on the layers layer_types marks (derived: even layers), full attention on the "
            "others. Router: logits = router.weight x + router.bias, top-2 by logit, weights = softmax of the 2 "
            "logits. Experts stored merged: gate_up_proj [E, H, 2I] used as x @ W with gate = columns 0::2 and "
            "up = columns 1::2, gate_up_proj_bias [E, 2I] likewise interleaved; down_proj [E, I, H], "
            "down_proj_bias [E, H]. Activation: g = min(gate, limit), u = clamp(up, -limit, limit), "
            "out = (u + 1) * g * sigmoid(alpha * g)."
        ),
    ),
}


# Extra variants: each one reuses an ARCHS entry (classes, tokenizer, special tokens, prompt length,
# base config) and applies `overrides` to the base config (and deletes the keys in `drop`).  They
# live in their own output dirs; the ten base dirs above do not depend on this table (every model
# is built from its own seeds), so adding or changing an entry here leaves them byte-identical.
# `dtype` is the stored dtype: f32, bf16 or f16.  The oracle is always float32 compute.
EXTRA_VARIANTS: dict[str, dict] = {
    "mixtral-f16": dict(
        arch="mixtral",
        dtype="f16",
        seed=1171,
        overrides=dict(sliding_window=8),
        notes=(
            "Mixtral as mixtral-f32 but every tensor stored as float16 (config dtype float16) and "
            "sliding_window=8: in EVERY layer a query at position i attends to key positions j with "
            "i-8 < j <= i (itself and the 7 previous tokens). The 22-token prompt is longer than the "
            "window, so the window cuts attention in prefill and in every decode step. The oracle is "
            "float32 compute from the exactly upcast f16 weights."
        ),
    ),
    "qwen2_moe-swa-f32": dict(
        arch="qwen2_moe",
        dtype="f32",
        seed=2271,
        overrides=dict(
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=2,  # layer_types derived by Qwen2MoeConfig (layer_types=None)
            qkv_bias=False,
            norm_topk_prob=False,
            mlp_only_layers=[],
            decoder_sparse_step=1,
        ),
        notes=(
            "Qwen2-MoE with use_sliding_window=True, sliding_window=6, max_window_layers=2. transformers 5.23 "
            "derives layer_types[i] = sliding_attention iff (i+1) % 2 == 1 (i even) and i < max_window_layers "
            "and use_sliding_window -> layer 0 sliding, layers 1 and 2 full (config.json stores the list). "
            "Sliding layers: query i sees keys i-6 < j <= i; full layers: j <= i. qkv_bias=False (no q/k/v/o "
            "bias at all), norm_topk_prob=False, all 3 layers sparse (routed top-3 of 6 + gated shared expert)."
        ),
    ),
    "olmoe-tied-f32": dict(
        arch="olmoe",
        dtype="f32",
        seed=4471,
        overrides=dict(tie_word_embeddings=True, attention_bias=True, clip_qkv=None),
        # With tied embeddings and the standard init, greedy decoding collapses into repeating one
        # token (a large embedding makes every token predict itself through the residual stream; a
        # small one leaves the output dominated by the context, which barely changes from step to
        # step).  Make the current token matter through the experts instead: embedding (= lm_head)
        # std 0.2 (rows >= 1000 x0.02), expert down_proj x3, o_proj weight+bias x0.5.
        init_scale={"embed_tokens.weight": 0.2, "experts.down_proj": 3.0, "o_proj.weight": 0.5, "o_proj.bias": 0.5},
        notes=(
            "OLMoE as olmoe-bf16 (clip_qkv=null, whole-projection q/k RMSNorm) but float32, "
            "tie_word_embeddings=True (lm_head.weight is NOT in the safetensors file; the output projection "
            "is model.embed_tokens.weight) and attention_bias=True: q_proj, k_proj, v_proj AND o_proj have a "
            "bias. The q/k biases are added before q_norm/k_norm."
        ),
    ),
    "qwen3_moe-dense-f32": dict(
        arch="qwen3_moe",
        dtype="f32",
        seed=3371,
        overrides=dict(mlp_only_layers=[0], attention_bias=True, norm_topk_prob=False, num_experts_per_tok=1),
        drop=["head_dim"],  # no head_dim in config.json -> hidden/heads = 16
        notes=(
            "Qwen3-MoE with no head_dim key in config.json (head_dim = hidden/heads = 16), "
            "mlp_only_layers=[0]: layer 0 is a dense SwiGLU MLP (mlp.{gate,up,down}_proj, intermediate_size "
            "64), layer 1 sparse; attention_bias=True: q/k/v/o biases (q/k bias added before the per-head "
            "q_norm/k_norm); top-1 of 6 experts with norm_topk_prob=False, so the single routed expert is "
            "weighted by its softmax probability (< 1), not by 1."
        ),
    ),
    "gpt_oss-mxfp4": dict(
        arch="gpt_oss",
        dtype="f32",
        seed=8871,
        overrides=dict(
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
            },
            swiglu_limit=7.0,
        ),
        mxfp4_experts=True,
        notes=(
            "gpt-oss as gpt_oss-f32 (limit 7.0) but with the routed experts stored as the released gpt-oss "
            "checkpoints store them: MXFP4 in OpenAI's layout, experts.gate_up_proj_blocks [E, 2I, H/32, 16] "
            "and _scales [E, 2I, H/32] (uint8; rows = output features, gate and up alternating; each byte holds "
            "elements 2j (low nibble) and 2j+1 (high); value = FP4[code] * 2^(scale - 127)), down_proj_blocks "
            "[E, H, I/32, 16] and _scales; biases and every other tensor float32. The codes are gguf 0.19's "
            "MXFP4 quantization of the random float experts. config.json has quantization_config "
            "{quant_method: mxfp4}; the oracle is transformers loading it with Mxfp4Config(dequantize=True) "
            "(exactly the MXFP4 values in float32)."
        ),
    ),
    "deepseek_v3-fp8": dict(
        arch="deepseek_v3",
        dtype="bf16",
        seed=7771,
        overrides={},
        fp8_block=[8, 4],
        notes=(
            "DeepSeek-V3 as deepseek_v3-f32 (q LoRA, YaRN, interleaved RoPE, 4 groups / best 2, renormalised "
            "x 2.5) stored as DeepSeek-V3's release stores it: every 2-D projection weight (q_a/q_b, "
            "kv_a_proj_with_mqa, kv_b, o_proj, the dense MLP, routed and shared experts) is float8_e4m3fn "
            "(safetensors F8_E4M3) with a float32 `<name>_scale_inv` [ceil(rows/8), ceil(cols/4)] beside it, "
            "value = e4m3(code) x scale_inv of its 8 x 4 block (weight_block_size [8, 4]: 128 x 128 in the "
            "release, smaller here so every tensor has several blocks of each dimension; transformers 5.23's "
            "dequantizer needs the blocks to tile the weight). Scales are the block's max |w| / 448. "
            "Embeddings, norms, router gate (weight and e_score_correction_bias) and lm_head stay bfloat16. "
            "config.json has quantization_config {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic, "
            "weight_block_size: [8, 4]}; the oracle is transformers loading it with "
            "FineGrainedFP8Config(dequantize=True) on a CPU (weights = e4m3 x scale in float32). "
            "oracle/f8_e4m3_values.f32 holds torch's float32 value of each of the 256 e4m3fn codes."
        ),
    ),
    "phimoe-norope-f32": dict(
        arch="phimoe",
        dtype="f32",
        seed=5571,
        overrides=dict(
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            router_jitter_noise=0.01,
            attention_bias=False,
            lm_head_bias=False,
        ),
        notes=(
            "PhiMoE with default RoPE (rope_type default, theta 1e4; no short/long factors, no mscale: "
            "cos/sin unscaled), sparsemixer eps = router_jitter_noise = 0.01 (the real Phi-3.5-MoE value), "
            "no attention biases and no lm_head bias; LayerNorm (with bias) as in every PhiMoE."
        ),
    ),
}

DTYPE_NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def all_jobs() -> list[dict]:
    """Every output dir: the ten base dirs (ARCHS x f32/bf16) first, then EXTRA_VARIANTS."""
    jobs = []
    for arch, spec in ARCHS.items():
        for variant in ("f32", "bf16"):
            jobs.append(
                dict(
                    name=f"{arch}-{variant}",
                    arch=arch,
                    dtype=variant,
                    seed=spec["seed"] + (0 if variant == "f32" else 50),
                    overrides=spec["variants"][variant],
                    drop=[],
                    shard=spec.get("shard", {}).get(variant),
                    notes=spec["notes"],
                    init_scale=None,
                    extra=False,
                    mxfp4_experts=False,
                )
            )
    for name, ex in EXTRA_VARIANTS.items():
        jobs.append(
            dict(
                name=name,
                arch=ex["arch"],
                dtype=ex["dtype"],
                seed=ex["seed"],
                overrides=ex["overrides"],
                drop=list(ex.get("drop", [])),
                shard=ex.get("shard"),
                notes=ex["notes"],
                init_scale=ex.get("init_scale"),
                extra=True,
                mxfp4_experts=ex.get("mxfp4_experts", False),
                fp8_block=ex.get("fp8_block"),
            )
        )
    return jobs


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, flush=True)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_f32(path: Path, t: torch.Tensor) -> None:
    arr = t.detach().to(torch.float32).cpu().contiguous().numpy().astype("<f4", copy=False)
    arr.tofile(path)


def top2_margin(row: torch.Tensor) -> float:
    v = torch.topk(row.float(), 2).values
    return float(v[0] - v[1])


def load_tokenizer(name: str):
    """Return (tokenizers.Tokenizer, dir) or (None, None)."""
    d = TOK_ROOT / name
    tj = d / "tokenizer.json"
    if not tj.is_file():
        return None, None
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(tj)), d
    except Exception as e:  # pragma: no cover - depends on the other engineer's output
        warnings.warn(f"could not load tokenizer {tj}: {e}")
        return None, None


def token_id(tok, text: str):
    if tok is None:
        return None
    i = tok.token_to_id(text)
    return int(i) if i is not None else None


def make_prompt(spec: dict, tok, source: str, seed: int):
    """Return (ids, source_description, text_or_None)."""
    n = spec["prompt_len"]
    if tok is not None and source == "auto":
        words: list[str] = []
        for w in PROMPT_WORDS * 3:
            words.append(w)
            text = " ".join(words)
            ids = tok.encode(text, add_special_tokens=True).ids
            if len(ids) >= n:
                break
        if len(ids) >= n and all(0 <= i < TOKEN_ID_LIMIT for i in ids) and len(ids) <= n + 8:
            return [int(i) for i in ids], "tokenizer", text
        warnings.warn(f"{spec['tokenizer']}: tokenized prompt unusable (len {len(ids)}); using random ids")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, TOKEN_ID_LIMIT, (n,), generator=g).tolist()
    return [int(i) for i in ids], "random", None


# --------------------------------------------------------------------------------------
# Deterministic "loud" initialisation
# --------------------------------------------------------------------------------------


@torch.no_grad()
def init_params(model: torch.nn.Module, seed: int, hidden: int, scale: dict | None = None) -> None:
    """Overwrite every parameter deterministically.

    Scales are chosen per fan-in so that activations stay O(1), attention is neither uniform nor
    one-hot, routers produce logits with std ~1.5-2, and final logits have std ~3.
    Norm weights are 1 + noise and biases are non-zero so that omitting them is detectable.
    ``scale`` (extra variants only): {parameter-name suffix: factor} applied on top of this init
    (the random stream is unchanged).
    """
    g = torch.Generator().manual_seed(seed)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied:  # named_parameters() lists the shared tensor once, as model.embed_tokens.weight
        assert model.lm_head.weight is model.get_input_embeddings().weight

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    transposed = type(model).__name__.startswith("GptOss")  # experts used as x @ W: fan-in is shape[-2]
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        shape = tuple(p.shape)
        if name.endswith("self_attn.sinks"):  # gpt-oss: one sink logit per head, the size of a score
            val = 1.0 * randn(shape)
        elif name.endswith("_proj_bias"):  # gpt-oss expert biases [E, 2I] / [E, H]
            val = 0.1 * randn(shape)
        elif transposed and (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")):
            val = randn(shape) * (1.0 / shape[-2] ** 0.5)
        elif name.endswith("embed_tokens.weight"):
            val = randn(shape) * 1.0
            if tied:  # it is also the lm_head: rows with no token never win greedy
                val[TOKEN_ID_LIMIT:] *= 0.02
        elif "norm" in name and name.endswith(".weight"):  # RMSNorm/LayerNorm/q_norm/k_norm weights
            val = 1.0 + 0.2 * randn(shape)
        elif "norm" in name and name.endswith(".bias"):  # LayerNorm bias (phimoe)
            val = 0.1 * randn(shape)
        elif name == "lm_head.weight":
            val = randn(shape) * (3.0 / hidden**0.5)
            val[TOKEN_ID_LIMIT:] *= 0.02  # rows with no token never win greedy
        elif name == "lm_head.bias":
            val = 0.3 * randn(shape)
            val[TOKEN_ID_LIMIT:] = 0.0
        elif name.endswith(".bias"):  # attention biases
            val = 0.2 * randn(shape)
        elif name.endswith("mlp.gate.weight") or name.endswith("mlp.router.weight"):  # routers [E, H]
            val = randn(shape) * (1.8 / shape[-1] ** 0.5)
        elif name.endswith("shared_expert_gate.weight"):  # [1, H]
            val = randn(shape) * (1.5 / shape[-1] ** 0.5)
        elif name.endswith("experts.gate_up_proj"):  # [E, 2I, H]
            val = randn(shape) * (1.0 / shape[-1] ** 0.5)
        elif name.endswith("experts.down_proj"):  # [E, H, I]
            val = randn(shape) * (1.0 / shape[-1] ** 0.5)
        elif (
            name.endswith("q_proj.weight") or name.endswith("k_proj.weight")
        ):  # sharper attention than 1/sqrt(fan_in)
            val = randn(shape) * (1.4 / shape[-1] ** 0.5)
        elif name.endswith(".weight") and len(shape) == 2:  # v/o proj, dense MLPs, shared expert
            val = randn(shape) * (1.0 / shape[-1] ** 0.5)
        else:
            raise RuntimeError(f"init_params: unhandled parameter {name} {shape}")
        for suffix, factor in (scale or {}).items():
            if name.endswith(suffix):
                val = val * factor
        p.copy_(val.to(p.dtype))
    # DeepSeek-V3's score-correction bias is a buffer (saved with the weights); make it matter:
    # sigmoid scores lie in (0, 1), a bias of std 0.1 changes some choices.
    for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
        if name.endswith("e_score_correction_bias"):
            b.copy_((0.1 * randn(tuple(b.shape))).to(b.dtype))


# --------------------------------------------------------------------------------------
# Router decision gaps (distance of each discrete routing decision from a tie)
# --------------------------------------------------------------------------------------


class RouterRecorder:
    def __init__(self, model):
        self.logits: list[torch.Tensor] = []
        self.group_gaps: list[float] = []  # DeepSeek group-limited routers: gaps measured per call
        self.handles = []
        for _, m in model.named_modules():
            if type(m).__name__.lower().endswith("topkrouter"):
                self.handles.append(m.register_forward_hook(self._hook))

    def _hook(self, module, inputs, output):
        lg = output[0].detach().float().reshape(-1, output[0].shape[-1]).clone()
        self.logits.append(lg)
        grouped = hasattr(module, "e_score_correction_bias") or getattr(module, "topk_method", None) == (
            "group_limited_greedy"
        )
        if grouped:
            self.group_gaps.append(group_router_gap(module, lg))

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def group_router_gap(module, lg: torch.Tensor) -> float:
    """DeepSeek group-limited routing: the smallest distance of a routing decision from its tie point:
    the group ranking at topk_group and the expert ranking at top_k among the kept groups, in the
    units of the choice score (V3: sigmoid + e_score_correction_bias, groups by the sum of their
    two best; V2: softmax probabilities, groups by their best)."""
    E = lg.shape[-1]
    G, tg, k = module.num_group, module.topk_group, module.top_k
    gs = E // G
    if hasattr(module, "e_score_correction_bias"):
        ch = lg.double().sigmoid() + module.e_score_correction_bias.double()
        gsc = ch.view(-1, G, gs).topk(2, dim=-1)[0].sum(-1)
    else:
        ch = lg.double().softmax(-1)
        gsc = ch.view(-1, G, gs).max(-1).values
    gaps = []
    sg = gsc.sort(-1, descending=True).values
    if tg < G:
        gaps.append(float((sg[:, tg - 1] - sg[:, tg]).min()))
    keep = torch.zeros_like(gsc, dtype=torch.bool).scatter_(1, gsc.topk(tg, dim=-1).indices, True)
    keep = keep.unsqueeze(-1).expand(-1, G, gs).reshape(-1, E)
    sc = ch.masked_fill(~keep, float("-inf")).sort(-1, descending=True).values
    if k < tg * gs:
        gaps.append(float((sc[:, k - 1] - sc[:, k]).min()))
    return min(gaps) if gaps else float("inf")


def router_stats(logits_list, kind: str, top_k: int, eps: float | None, group_gaps=None) -> dict:
    if not logits_list:
        return {"min_router_gap": None}
    L = torch.cat(logits_list, 0).double()
    s, _ = torch.sort(L, dim=-1, descending=True)
    out: dict = {"router_rows": int(L.shape[0])}
    if group_gaps:  # DeepSeek group-limited (and sigmoid) routers
        out["min_router_gap"] = min(group_gaps)
        out["router_kind"] = "group_limited"
        return out
    if kind.startswith("softmax"):
        # the softmax is monotonic, so the top-k set flips only when s[k-1] == s[k]
        gap = (s[:, top_k - 1] - s[:, top_k]).min().item()
        out["min_router_gap"] = gap
        return out
    # sparsemixer (phimoe), eval mode
    two_eps = 2.0 * eps
    gaps = [(s[:, 0] - s[:, 1]).min().item(), (s[:, 1] - s[:, 2]).min().item()]
    # stage 1: threshold = max; masked iff (max - s_j) / max(|s_j|, max) > 2 eps
    thr1 = s[:, :1]
    rel1 = (thr1 - L) / torch.maximum(L.abs(), thr1)
    # stage 2: threshold = second max (top-1 removed); same formula with the ORIGINAL scores
    top1 = L.argmax(-1, keepdim=True)
    thr2 = s[:, 1:2]
    rel2 = (thr2 - L) / torch.maximum(L.abs(), thr2)
    rel2 = rel2.scatter(-1, top1, float("inf"))
    gaps.append((rel1 - two_eps).abs().min().item())
    gaps.append((rel2 - two_eps).abs().min().item())
    out["min_router_gap"] = min(gaps)
    kept1 = (rel1 <= two_eps).sum(-1)  # experts entering the stage-1 softmax (>=1: the top-1 itself)
    kept2 = (rel2 <= two_eps).sum(-1)
    out["sparsemixer_rows_with_nontrivial_softmax_stage1"] = int((kept1 > 1).sum())
    out["sparsemixer_rows_with_nontrivial_softmax_stage2"] = int((kept2 > 1).sum())
    return out


class ClipRecorder:
    """Counts how many q/k/v values OLMoE's clip_qkv actually clamps."""

    def __init__(self, model, clip):
        self.clip = clip
        self.clamped = 0
        self.total = 0
        self.handles = []
        if clip is None:
            return
        for name, m in model.named_modules():
            if name.endswith("self_attn.q_norm") or name.endswith("self_attn.k_norm"):
                self.handles.append(m.register_forward_hook(self._hook_out))
            elif name.endswith("self_attn.v_proj"):
                self.handles.append(m.register_forward_hook(self._hook_out))

    def _hook_out(self, module, inputs, output):
        self.clamped += int((output.abs() > self.clip).sum())
        self.total += output.numel()

    def remove(self):
        for h in self.handles:
            h.remove()


# --------------------------------------------------------------------------------------
# Oracle computation
# --------------------------------------------------------------------------------------


def load(dirpath: Path, dtype):
    extra = {}
    if json.loads((dirpath / "config.json").read_text()).get("quantization_config", {}).get("quant_method") == "mxfp4":
        # MXFP4 experts: transformers dequantizes them on a CPU (exactly: FP4 values times powers of two)
        extra["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
    if json.loads((dirpath / "config.json").read_text()).get("quantization_config", {}).get("quant_method") == "fp8":
        # block-scaled FP8 (DeepSeek-V3's release format): transformers dequantizes it on a CPU
        qc = json.loads((dirpath / "config.json").read_text())["quantization_config"]
        extra["quantization_config"] = transformers.FineGrainedFP8Config(
            dequantize=True, weight_block_size=tuple(qc["weight_block_size"])
        )
    m = transformers.AutoModelForCausalLM.from_pretrained(
        str(dirpath), dtype=dtype, attn_implementation="eager", experts_implementation="eager", **extra
    )
    if "quantization_config" in extra and is_fp8_config(dirpath):
        # with an FP8 quantizer transformers 5.23 leaves the unquantized tensors (embeddings, norms, router,
        # lm_head) at their stored bfloat16 and mixes dtypes in the forward; upcast them (exactly) to `dtype`.
        # The dequantized weights are already `dtype` (e4m3 x scale computed in float32).
        m = m.to(dtype)
    m.eval()
    return m


@torch.no_grad()
def greedy_cached(model, prompt_ids: list[int], n_gen: int):
    """Prefill + greedy decode through a DynamicCache. Returns (prefill_logits [n,V],
    decode_logits [n_gen-1,V], greedy_ids, margins, cache)."""
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    prefill = out.logits[0].float().clone()
    greedy = [int(prefill[-1].argmax())]
    margins = [top2_margin(prefill[-1])]
    dec = []
    for _ in range(n_gen - 1):
        out = model(input_ids=torch.tensor([[greedy[-1]]]), past_key_values=cache, use_cache=True)
        row = out.logits[0, -1].float().clone()
        dec.append(row)
        greedy.append(int(row.argmax()))
        margins.append(top2_margin(row))
    dec_t = torch.stack(dec) if dec else torch.zeros(0, prefill.shape[-1])
    return prefill, dec_t, greedy, margins, cache


@torch.no_grad()
def run_generate(model, prompt_ids: list[int], n_gen: int):
    gc = GenerationConfig(
        do_sample=False,
        max_new_tokens=n_gen,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
        output_logits=True,
        return_dict_in_generate=True,
    )
    g = model.generate(torch.tensor([prompt_ids]), generation_config=gc)
    new = g.sequences[0, len(prompt_ids):].tolist()
    logits = torch.stack([x[0].float() for x in g.logits])
    return new, logits


@torch.no_grad()
def compute_oracle(model, spec: dict, prompt_ids: list[int]) -> dict:
    cfg = model.config
    rec = RouterRecorder(model)
    clip = getattr(cfg, "clip_qkv", None) if spec["config_cls"] is OlmoeConfig else None
    cliprec = ClipRecorder(model, clip)
    prefill, dec, greedy, margins, cache = greedy_cached(model, prompt_ids, N_GENERATE)
    rec.remove()
    cliprec.remove()

    top_k = cfg.num_experts_per_tok
    eps = getattr(cfg, "router_jitter_noise", None)
    rstats = router_stats(rec.logits, spec["router_kind"], top_k, eps, rec.group_gaps)

    n = len(prompt_ids)
    # 1) prefill without cache must equal prefill with cache
    nocache = model(input_ids=torch.tensor([prompt_ids]), use_cache=False).logits[0].float()
    d_nocache = float((nocache - prefill).abs().max())
    # 2) full recompute of prompt + greedy[:-1]: rows n-1.. == [prefill last, decode rows]
    full_ids = prompt_ids + greedy[:-1]
    full = model(input_ids=torch.tensor([full_ids]), use_cache=False).logits[0].float()
    cached_rows = torch.cat([prefill[-1:], dec], 0)
    d_recompute = float((full[n - 1 :] - cached_rows).abs().max())
    # 3) model.generate
    gen_ids, gen_logits = run_generate(model, prompt_ids, N_GENERATE)
    gen_match = gen_ids == greedy
    d_generate = float((gen_logits - cached_rows).abs().max()) if gen_logits.shape == cached_rows.shape else None
    # 4) longer cached decode vs one full forward
    seq = list(prompt_ids) + list(greedy)
    nxt = greedy[-1]
    long_rows = []
    for _ in range(N_LONG_EXTRA):
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
        row = out.logits[0, -1].float()
        long_rows.append(row)
        nxt = int(row.argmax())
        seq.append(nxt)
    full_long = model(input_ids=torch.tensor([seq[:-1]]), use_cache=False).logits[0].float()
    d_long = float((full_long[len(prompt_ids) + len(greedy) - 1 :] - torch.stack(long_rows)).abs().max())

    res = dict(
        prefill=prefill,
        decode=dec,
        greedy=greedy,
        margins=margins,
        min_margin=min(margins),
        rstats=rstats,
        d_nocache=d_nocache,
        d_recompute=d_recompute,
        gen_match=gen_match,
        d_generate=d_generate,
        d_long=d_long,
        long_total_len=len(seq) - 1,
        logit_std=float(prefill.std()),
        clip=None
        if clip is None
        else {"clip_qkv": clip, "clamped_values": cliprec.clamped, "total_values": cliprec.total},
    )
    return res


@torch.no_grad()
def phimoe_short_prompt(model, prompt_ids: list[int], n_short: int = 12):
    """PhiMoE: prompt shorter than original_max_position_embeddings, greedy via model.generate
    (which re-computes the whole sequence when it first exceeds original_max_position_embeddings)."""
    p = prompt_ids[:n_short]
    gen_ids, gen_logits = run_generate(model, p, N_GENERATE)
    # generate semantics == a full no-cache recompute of the sequence seen at every step
    # (step i sees n_short + i tokens; the mscale regime depends on that length)
    seq = p + gen_ids
    rec = RouterRecorder(model)
    full = torch.stack(
        [
            model(input_ids=torch.tensor([seq[: n_short + i]]), use_cache=False).logits[0, -1].float()
            for i in range(N_GENERATE)
        ]
    )
    rec.remove()
    rstats = router_stats(rec.logits, "sparsemixer", model.config.num_experts_per_tok, model.config.router_jitter_noise)
    d_full = float((full - gen_logits).abs().max())
    assert d_full < 1e-3, ("phimoe short prompt: generate != per-step full recompute", d_full)
    # naive cache loop (no re-computation at the crossing) for comparison
    _, dec, naive_ids, _, _ = greedy_cached(model, p, N_GENERATE)
    return dict(
        prompt_ids=p,
        greedy_ids=gen_ids,
        logits=gen_logits,
        min_margin=min(top2_margin(r) for r in gen_logits),
        d_full=d_full,
        naive_ids=naive_ids,
        rstats=rstats,
    )



# --------------------------------------------------------------------------------------
# Independent NumPy reference forward (float64), reading the saved files directly.
# This is an executable restatement of the README's per-architecture notes; the script
# asserts that it reproduces transformers' float32 logits.
# --------------------------------------------------------------------------------------


def np_load_checkpoint(d: Path) -> dict:
    """Every tensor as float64; block-scaled FP8 weights dequantized here, independently of transformers, by
    DeepSeek-V3's definition: w[i, j] = e4m3(q[i, j]) * scale_inv[i // b0, j // b1] (edge blocks may be partial)."""
    from safetensors.torch import load_file

    files = sorted(d.glob("*.safetensors"))
    W, raw = {}, {}
    for f in files:
        raw.update(load_file(str(f)))
    qc = json.loads((d / "config.json").read_text()).get("quantization_config", {})
    for k, v in raw.items():
        if k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            b0, b1 = qc["weight_block_size"]
            s = raw[k + "_scale_inv"].to(torch.float64).numpy()
            r, c = v.shape
            assert s.shape == (-(-r // b0), -(-c // b1)), (k, s.shape)
            full = np.repeat(np.repeat(s, b0, 0), b1, 1)[:r, :c]
            W[k] = v.to(torch.float64).numpy() * full
        else:
            W[k] = v.to(torch.float64).numpy()  # bf16 -> f64 is exact
    return W


def np_checkpoint_keys(d: Path) -> set:
    from safetensors import safe_open

    keys = set()
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            keys.update(fh.keys())
    return keys


def np_layer_windows(cfg: dict) -> list:
    """Per layer: the sliding window W (query i sees keys i-W < j <= i) or None (full causal, j <= i).

    transformers 5.23: Qwen2-MoE decides per layer from config.layer_types ("sliding_attention" layers
    use config.sliding_window; Qwen2MoeConfig stores sliding_window=0 when use_sliding_window is
    false). Mixtral, PhiMoE and Qwen3-MoE apply config.sliding_window (if not null) to EVERY layer.
    OLMoE never slides."""
    n = cfg["num_hidden_layers"]
    mt = cfg["model_type"]
    sw = cfg.get("sliding_window")
    if mt == "qwen2_moe":
        lt = cfg.get("layer_types") or ["full_attention"] * n
        return [sw if t == "sliding_attention" else None for t in lt]
    if mt in ("mixtral", "phimoe", "qwen3_moe") and sw is not None:
        return [sw] * n
    return [None] * n


def attention_layer_info(d: Path) -> dict:
    cfg = json.loads((d / "config.json").read_text())
    w = np_layer_windows(cfg)
    return {
        "window_per_layer": w,
        "sliding_layers": [i for i, x in enumerate(w) if x is not None],
        "rule": "layer with window W: query position i attends to key positions j with i-W < j <= i "
        "(W keys including itself); window null: all j <= i",
    }


def np_rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def np_layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)  # biased variance
    return (x - mu) / np.sqrt(var + eps) * w + b


def np_silu(x):
    return x / (1.0 + np.exp(-x))


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_rope_tables(cfg: dict, head_dim: int, T: int):
    """cos/sin tables [T, head_dim] for positions 0..T-1 of a sequence of total length T
    (full-recompute semantics)."""
    rp = cfg["rope_parameters"]
    theta = rp["rope_theta"]
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    mscale = 1.0
    if rp["rope_type"] == "longrope":
        inv = inv / np.asarray(rp["short_factor"], dtype=np.float64)  # long_factor unused (HF 5.23)
        mscale = rp["long_mscale"] if T > rp["original_max_position_embeddings"] else rp["short_mscale"]
    elif rp["rope_type"] != "default":
        raise NotImplementedError(rp["rope_type"])
    f = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    emb = np.concatenate([f, f], -1)  # NeoX / rotate_half layout
    return np.cos(emb) * mscale, np.sin(emb) * mscale


def np_rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def np_sparsemixer(l, eps):
    """PhiMoE eval-mode routing for one token. l: [E] router logits -> [(expert, weight)] x 2."""
    two_eps = 2.0 * eps
    i1 = int(np.argmax(l))
    m1 = l[i1]
    keep1 = (m1 - l) / np.maximum(np.abs(l), m1) <= two_eps
    w1 = np.exp(l[i1] - m1) / np.exp(l[keep1] - m1).sum()
    l2 = l.copy()
    l2[i1] = -np.inf
    i2 = int(np.argmax(l2))
    m2 = l[i2]
    keep2 = (m2 - l) / np.maximum(np.abs(l), m2) <= two_eps  # factor uses the ORIGINAL scores
    keep2[i1] = False
    w2 = np.exp(l[i2] - m2) / np.exp(l[keep2] - m2).sum()
    return [(i1, w1), (i2, w2)]


def np_yarn(rp: dict, dim: int, max_pos: int):
    """YaRN inverse frequencies [dim/2] and cos/sin factor, as _compute_yarn_parameters (float64)."""
    base = rp["rope_theta"]
    omp = rp.get("original_max_position_embeddings") or max_pos
    factor = rp.get("factor") or max_pos / omp

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    af = rp.get("attention_factor")
    if af is None:
        ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
        af = get_mscale(factor, ms) / get_mscale(factor, msa) if ms and msa else get_mscale(factor)
    beta_fast, beta_slow = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

    def corr(rot):
        return (dim * math.log(omp / (rot * 2 * math.pi))) / (2 * math.log(base))

    lo, hi = corr(beta_fast), corr(beta_slow)
    if rp.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
    pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extra_share = 1 - ramp
    inv = (1.0 / (factor * pos)) * (1 - extra_share) + (1.0 / pos) * extra_share
    return inv, af


def np_reference_deepseek(cfg: dict, W: dict, ids: list[int]) -> np.ndarray:
    """DeepSeek-V2/V3 in float64 with FULL keys and values (kv_b_proj applied to every cached latent,
    as transformers does): the C side absorbs kv_b_proj instead, so this is an independent statement."""
    mt = cfg["model_type"]
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rd, vd, r = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    qlr, eps, T = cfg.get("q_lora_rank"), cfg["rms_norm_eps"], len(ids)
    bias = cfg.get("attention_bias", False)
    rp = cfg["rope_parameters"]
    inv = 1.0 / rp["rope_theta"] ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
    af, scale = 1.0, (nope + rd) ** -0.5
    if rp["rope_type"] == "yarn":
        inv, af = np_yarn(rp, rd, cfg["max_position_embeddings"])
    elif rp["rope_type"] != "default":
        raise NotImplementedError(rp["rope_type"])
    if rp["rope_type"] != "default" and rp.get("mscale_all_dim"):
        m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0
        scale = scale * m * m
    f = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(f) * af, np.sin(f) * af  # [T, rd/2]
    interleave = mt == "deepseek_v2" or cfg.get("rope_interleave", True)

    def rope(x):  # [..., T, rd]; output layout does not matter (q and k alike)
        x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleave else (x[..., : rd // 2], x[..., rd // 2 :])
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def lin(x, name, b=False):
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if b else y

    def swiglu(x, p):
        return lin(np_silu(lin(x, p + ".gate_proj")) * lin(x, p + ".up_proj"), p + ".down_proj")

    mask = np.where(np.arange(T)[None, :] <= np.arange(T)[:, None], 0.0, -np.inf)
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    rsf = cfg.get("routed_scaling_factor", 1.0)
    x = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        P, A = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        h = np_rms(x, W[f"{P}.input_layernorm.weight"], eps)
        if qlr:
            q = lin(np_rms(lin(h, f"{A}.q_a_proj", bias), W[f"{A}.q_a_layernorm.weight"], 1e-6), f"{A}.q_b_proj")
        else:
            q = lin(h, f"{A}.q_proj")
        q = q.reshape(T, nh, nope + rd).transpose(1, 0, 2)  # [nh, T, nope+rd]
        ckv = lin(h, f"{A}.kv_a_proj_with_mqa", bias)
        lat = np_rms(ckv[:, :r], W[f"{A}.kv_a_layernorm.weight"], 1e-6)
        kv = lin(lat, f"{A}.kv_b_proj").reshape(T, nh, nope + vd).transpose(1, 0, 2)
        k_nope, v = kv[..., :nope], kv[..., nope:]
        q_rot, k_rot = rope(q[..., nope:]), rope(ckv[:, r:])
        sc = (q[..., :nope] @ k_nope.transpose(0, 2, 1) + q_rot @ k_rot.T) * scale + mask
        a = (np_softmax(sc) @ v).transpose(1, 0, 2).reshape(T, nh * vd)
        x = x + lin(a, f"{A}.o_proj", bias)
        h = np_rms(x, W[f"{P}.post_attention_layernorm.weight"], eps)
        M = f"{P}.mlp"
        if i < cfg.get("first_k_dense_replace", 0):
            x = x + swiglu(h, M)
            continue
        logits = lin(h, f"{M}.gate")
        y = np.zeros_like(h)
        for t in range(T):
            if mt == "deepseek_v3":
                sc_t = 1.0 / (1.0 + np.exp(-logits[t]))
                ch = sc_t + W[f"{M}.gate.e_score_correction_bias"]
                G, tg = cfg["n_group"], cfg["topk_group"]
                gs = np.sort(ch.reshape(G, -1), -1)[:, -2:].sum(-1)
                keep = np.repeat(np.isin(np.arange(G), np.argsort(-gs, kind="stable")[:tg]), E // G)
                sel = np.argsort(-np.where(keep, ch, -np.inf), kind="stable")[:K]
                w = sc_t[sel]
                if cfg.get("norm_topk_prob", True):
                    w = w / (w.sum() + 1e-20)
            else:
                p = np_softmax(logits[t])
                if cfg.get("topk_method", "greedy") == "group_limited_greedy":
                    G, tg = cfg["n_group"], cfg["topk_group"]
                    gs = p.reshape(G, -1).max(-1)
                    keep = np.repeat(np.isin(np.arange(G), np.argsort(-gs, kind="stable")[:tg]), E // G)
                    p = np.where(keep, p, 0.0)
                sel = np.argsort(-p, kind="stable")[:K]
                w = p[sel]
            for e, we in zip(sel, w * rsf):
                y[t] += we * swiglu(h[t], f"{M}.experts.{e}")
        x = x + y + swiglu(h, f"{M}.shared_experts")
    x = np_rms(x, W["model.norm.weight"], eps)
    return x @ W["lm_head.weight"].T


FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def np_gpt_oss_experts(W: dict, name: str) -> np.ndarray:
    """A merged expert tensor as used (x @ W, [E, n_in, n_out]): the float tensor, or the MXFP4 blocks and
    scales decoded with OpenAI's formula: byte j of a block holds elements 2j (low nibble) and 2j+1 (high),
    value = FP4[code] * 2^(scale - 127)."""
    if name in W:
        return W[name]
    blocks = W[name + "_blocks"].astype(np.uint8)  # [E, out, G, 16] (loaded as float64)
    scales = W[name + "_scales"].astype(np.int64) - 127  # [E, out, G]
    codes = np.stack([blocks & 15, blocks >> 4], -1).reshape(*blocks.shape[:-1], 32)
    vals = FP4_VALUES[codes] * np.exp2(scales)[..., None]
    E, O = blocks.shape[:2]
    return vals.reshape(E, O, -1).transpose(0, 2, 1)


NP_GPT_OSS_CLAMPED = [0, 0]  # clamped gate/up values, all gate/up values (the last call)


def np_reference_gpt_oss(cfg: dict, W: dict, ids: list[int]) -> np.ndarray:
    """gpt-oss in float64: sinks, per-layer sliding windows, biases, merged experts, clamped SwiGLU."""
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, T = cfg["rms_norm_eps"], len(ids)
    rp = cfg["rope_parameters"]
    if rp["rope_type"] == "yarn":
        inv, af = np_yarn(rp, hd, cfg["max_position_embeddings"])
    else:
        inv, af = 1.0 / rp["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd), 1.0
    f = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(f) * af, np.sin(f) * af

    def rope(x):  # halves
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def lin(x, name):
        return x @ W[name + ".weight"].T + W[name + ".bias"]

    qi, kj = np.arange(T)[:, None], np.arange(T)[None, :]
    sw = cfg["sliding_window"]
    lim, alpha = cfg["swiglu_limit"], cfg["swiglu_alpha"]
    E, K = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    clamped = total = 0
    x = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        P, A = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        sliding = cfg["layer_types"][i] == "sliding_attention"
        mask = np.where((kj <= qi) & ((kj > qi - sw) if sliding else True), 0.0, -np.inf)
        h = np_rms(x, W[f"{P}.input_layernorm.weight"], eps)
        q = rope(lin(h, f"{A}.q_proj").reshape(T, nh, hd).transpose(1, 0, 2))
        k = rope(lin(h, f"{A}.k_proj").reshape(T, nkv, hd).transpose(1, 0, 2))
        v = lin(h, f"{A}.v_proj").reshape(T, nkv, hd).transpose(1, 0, 2)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        sc = q @ k.transpose(0, 2, 1) * hd**-0.5 + mask  # [nh, T, T]
        sink = W[f"{A}.sinks"][:, None, None] * np.ones((1, T, 1))
        comb = np.concatenate([sc, sink], -1)
        p = np_softmax(comb)[..., :-1]  # the sink takes probability, gives nothing
        a = (p @ v).transpose(1, 0, 2).reshape(T, nh * hd)
        x = x + lin(a, f"{A}.o_proj")
        h = np_rms(x, W[f"{P}.post_attention_layernorm.weight"], eps)
        M = f"{P}.mlp"
        logits = lin(h, f"{M}.router")
        gu_w, gu_b = np_gpt_oss_experts(W, f"{M}.experts.gate_up_proj"), W[f"{M}.experts.gate_up_proj_bias"]
        dn_w, dn_b = np_gpt_oss_experts(W, f"{M}.experts.down_proj"), W[f"{M}.experts.down_proj_bias"]
        y = np.zeros_like(h)
        for t in range(T):
            sel = np.argsort(-logits[t], kind="stable")[:K]
            w = np_softmax(logits[t, sel])
            for e, we in zip(sel, w):
                gu = h[t] @ gu_w[e] + gu_b[e]
                g, u = gu[0::2], gu[1::2]
                clamped += int((g > lim).sum() + (np.abs(u) > lim).sum())
                total += 2 * len(g)
                g, u = np.minimum(g, lim), np.clip(u, -lim, lim)
                out = ((u + 1) * g / (1.0 + np.exp(-alpha * g))) @ dn_w[e] + dn_b[e]
                y[t] += we * out
        x = x + y
    NP_GPT_OSS_CLAMPED[:] = [clamped, total]
    x = np_rms(x, W["model.norm.weight"], eps)
    return x @ W["lm_head.weight"].T


def np_reference_logits(d: Path, ids: list[int]) -> np.ndarray:
    cfg = json.loads((d / "config.json").read_text())
    W = np_load_checkpoint(d)
    mt = cfg["model_type"]
    if mt.startswith("deepseek"):
        return np_reference_deepseek(cfg, W, ids)
    if mt == "gpt_oss":
        return np_reference_gpt_oss(cfg, W, ids)
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    T = len(ids)
    cos, sin = np_rope_tables(cfg, hd, T)
    qi, kj = np.arange(T)[:, None], np.arange(T)[None, :]
    masks = [
        np.where((kj <= qi) & ((kj > qi - w) if w is not None else True), 0.0, -np.inf)
        for w in np_layer_windows(cfg)
    ]
    n_exp = cfg.get("num_local_experts", cfg.get("num_experts"))
    topk = cfg["num_experts_per_tok"]

    def lin(x, name, bias=False):
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if bias else y

    def norm(x, name):
        if mt == "phimoe":
            return np_layernorm(x, W[name + ".weight"], W[name + ".bias"], eps)
        return np_rms(x, W[name + ".weight"], eps)

    def swiglu(x, gate, up, down):
        return lin(np_silu(lin(x, gate)) * lin(x, up), down)

    x = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        P = f"model.layers.{i}"
        h = norm(x, f"{P}.input_layernorm")
        # qwen2_moe: qkv_bias on q/k/v only; olmoe/qwen3_moe/phimoe: attention_bias on q/k/v AND o
        qkv_bias = cfg.get("qkv_bias", True) if mt == "qwen2_moe" else cfg.get("attention_bias", False)
        o_bias = mt in ("olmoe", "qwen3_moe", "phimoe") and cfg.get("attention_bias", False)
        q = lin(h, f"{P}.self_attn.q_proj", qkv_bias)
        k = lin(h, f"{P}.self_attn.k_proj", qkv_bias)
        v = lin(h, f"{P}.self_attn.v_proj", qkv_bias)
        if mt == "olmoe":  # RMSNorm over the whole projection, then clamp q, k, v
            q = np_rms(q, W[f"{P}.self_attn.q_norm.weight"], eps)
            k = np_rms(k, W[f"{P}.self_attn.k_norm.weight"], eps)
            c = cfg.get("clip_qkv")
            if c is not None:
                q, k, v = np.clip(q, -c, c), np.clip(k, -c, c), np.clip(v, -c, c)
        q = q.reshape(T, nh, hd).transpose(1, 0, 2)
        k = k.reshape(T, nkv, hd).transpose(1, 0, 2)
        v = v.reshape(T, nkv, hd).transpose(1, 0, 2)
        if mt == "qwen3_moe":  # per-head RMSNorm over head_dim
            q = np_rms(q, W[f"{P}.self_attn.q_norm.weight"], eps)
            k = np_rms(k, W[f"{P}.self_attn.k_norm.weight"], eps)
        q = q * cos + np_rotate_half(q) * sin
        k = k * cos + np_rotate_half(k) * sin
        rep = nh // nkv
        k = np.repeat(k, rep, axis=0)  # q head j uses kv head j // rep
        v = np.repeat(v, rep, axis=0)
        a = np_softmax(q @ k.transpose(0, 2, 1) * hd**-0.5 + masks[i]) @ v  # [nh, T, hd]
        a = a.transpose(1, 0, 2).reshape(T, nh * hd)
        x = x + lin(a, f"{P}.self_attn.o_proj", o_bias)

        h = norm(x, f"{P}.post_attention_layernorm")
        if mt in ("mixtral", "phimoe"):
            E = f"{P}.block_sparse_moe"
            logits = lin(h, f"{E}.gate")
            y = np.zeros_like(h)
            for t in range(T):
                if mt == "mixtral":
                    p = np_softmax(logits[t])
                    sel = np.argsort(-p, kind="stable")[:topk]
                    route = [(e, p[e] / p[sel].sum()) for e in sel]
                else:
                    route = np_sparsemixer(logits[t], cfg["router_jitter_noise"])
                for e, w in route:
                    ex = f"{E}.experts.{e}"
                    y[t] += w * swiglu(h[t], f"{ex}.w1", f"{ex}.w3", f"{ex}.w2")
        else:
            M = f"{P}.mlp"
            sparse = (
                i not in cfg.get("mlp_only_layers", [])
                and n_exp > 0
                and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0
            )
            if not sparse:
                y = swiglu(h, f"{M}.gate_proj", f"{M}.up_proj", f"{M}.down_proj")
            else:
                p = np_softmax(lin(h, f"{M}.gate"))
                y = np.zeros_like(h)
                for t in range(T):
                    sel = np.argsort(-p[t], kind="stable")[:topk]
                    w = p[t, sel]
                    if cfg.get("norm_topk_prob", False):
                        w = w / w.sum()
                    for e, we in zip(sel, w):
                        ex = f"{M}.experts.{e}"
                        y[t] += we * swiglu(h[t], f"{ex}.gate_proj", f"{ex}.up_proj", f"{ex}.down_proj")
                if mt == "qwen2_moe":
                    g = 1.0 / (1.0 + np.exp(-lin(h, f"{M}.shared_expert_gate")))
                    y = y + g * swiglu(
                        h, f"{M}.shared_expert.gate_proj", f"{M}.shared_expert.up_proj", f"{M}.shared_expert.down_proj"
                    )
        x = x + y
    x = norm(x, "model.norm")
    if cfg.get("tie_word_embeddings", False):
        # tied: the checkpoint has no lm_head.weight; the output projection is the embedding matrix
        assert "lm_head.weight" not in W or np.array_equal(W["lm_head.weight"], W["model.embed_tokens.weight"])
        W["lm_head.weight"] = W["model.embed_tokens.weight"]
    return lin(x, "lm_head", mt == "phimoe" and cfg.get("lm_head_bias", False))


# --------------------------------------------------------------------------------------
# Per-model driver
# --------------------------------------------------------------------------------------


MXFP4_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def mxfp4_openai(rows: np.ndarray):
    """float32 rows [R, n] -> (blocks [R, n/32, 16], scales [R, n/32]) in OpenAI's gpt-oss layout, with the
    codes of gguf's MXFP4 quantizer (ggml block: e, qs[16] with element j low and j+16 high; OpenAI: byte j
    holds elements 2j low and 2j+1 high, the same e8m0 scale)."""
    import gguf

    R, n = rows.shape
    q = np.asarray(gguf.quants.quantize(np.ascontiguousarray(rows, np.float32), gguf.GGMLQuantizationType.MXFP4))
    q = q.view(np.uint8).reshape(R, n // 32, 17)
    codes = np.concatenate([q[..., 1:] & 15, q[..., 1:] >> 4], -1)  # [R, G, 32] in element order
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8), q[..., 0].copy()


def write_mxfp4_experts(outdir: Path) -> None:
    """Replace the saved float experts by MXFP4 blocks and scales, as the released gpt-oss files hold them."""
    from safetensors.torch import load_file, save_file

    path = outdir / "model.safetensors"
    W = load_file(str(path))
    out = {}
    for k, v in W.items():
        if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
            rows = v.float().transpose(1, 2).numpy()  # x @ W: rows are the output features
            bl, sc = zip(*[mxfp4_openai(rows[e]) for e in range(rows.shape[0])])
            out[k + "_blocks"] = torch.from_numpy(np.stack(bl))
            out[k + "_scales"] = torch.from_numpy(np.stack(sc))
        else:
            out[k] = v
    save_file(out, str(path), metadata={"format": "pt"})
    cj = outdir / "config.json"
    c = json.loads(cj.read_text())
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": MXFP4_NOT_CONVERTED}
    cj.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")


FP8_MAX = 448.0  # largest finite float8_e4m3fn


def fp8_quantize_blocks(w: torch.Tensor, b0: int, b1: int):
    """float32 [R, C] -> (float8_e4m3fn [R, C], float32 scale_inv [ceil(R/b0), ceil(C/b1)]) as DeepSeek-V3's
    release quantizes: per b0 x b1 block, scale_inv = max|w| / 448 and q = round-to-nearest-even(w / scale_inv)."""
    R, C = w.shape
    gr, gc = -(-R // b0), -(-C // b1)
    s = torch.empty(gr, gc, dtype=torch.float32)
    q = torch.empty(R, C, dtype=torch.float8_e4m3fn)
    for i in range(gr):
        for j in range(gc):
            blk = w[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1]
            amax = float(blk.abs().max())
            sc = torch.tensor(max(amax, 1e-12) / FP8_MAX, dtype=torch.float32)
            s[i, j] = sc
            q[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = (blk / sc).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, s


def fp8_convertible(name: str, t: torch.Tensor) -> bool:
    """The tensors DeepSeek-V3's release stores as FP8: 2-D projection weights, not the embeddings, lm_head or
    the router gate."""
    if t.dim() != 2 or not name.endswith(".weight"):
        return False
    return not (name.startswith("model.embed_tokens") or name.startswith("lm_head") or name.endswith("mlp.gate.weight"))


def is_fp8_config(dirpath: Path) -> bool:
    return json.loads((dirpath / "config.json").read_text()).get("quantization_config", {}).get("quant_method") == "fp8"


def write_fp8_weights(outdir: Path, block: list[int]) -> None:
    """Replace the saved projection weights by float8_e4m3fn codes and float32 block scales (`<name>_scale_inv`),
    and record the quantization_config DeepSeek-V3's release has."""
    from safetensors.torch import load_file, save_file

    path = outdir / "model.safetensors"
    W = load_file(str(path))
    out = {}
    for k, v in W.items():
        if fp8_convertible(k, v):
            q, s = fp8_quantize_blocks(v.float(), block[0], block[1])
            out[k] = q
            out[k + "_scale_inv"] = s
        else:
            out[k] = v
    save_file(out, str(path), metadata={"format": "pt"})
    cj = outdir / "config.json"
    c = json.loads(cj.read_text())
    c["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": list(block),
    }
    cj.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")


def write_e4m3_table(path: Path) -> None:
    """torch's float32 value of each of the 256 float8_e4m3fn codes (NaN for 0x7f and 0xff), little-endian."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    write_f32(path, codes.to(torch.float32))


def build_and_save(job: dict, seed: int, outdir: Path, tok, tokdir) -> None:
    spec = ARCHS[job["arch"]]
    cfg_kwargs = copy.deepcopy(spec["config"])
    cfg_kwargs.update(copy.deepcopy(job["overrides"]))
    for key in job["drop"]:
        cfg_kwargs.pop(key, None)
    for key in ("bos", "eos"):
        text, fallback = spec["special_tokens"][key]
        tid = token_id(tok, text) if text is not None else None
        cfg_kwargs[f"{key}_token_id"] = tid if tid is not None else fallback
    torch.manual_seed(seed)
    config = spec["config_cls"](**cfg_kwargs)
    model = spec["model_cls"](config)
    model.eval()
    init_params(model, seed, config.hidden_size, job["init_scale"])
    tdt = TORCH_DTYPES[job["dtype"]]
    if tdt != torch.float32:
        model = model.to(tdt)
    model.config.dtype = tdt
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    shard = job["shard"]
    if shard:
        model.save_pretrained(str(outdir), max_shard_size=shard)
    else:
        model.save_pretrained(str(outdir))
    # make sure config.json records the stored dtype
    cj = outdir / "config.json"
    c = json.loads(cj.read_text())
    want = DTYPE_NAMES[job["dtype"]]
    if c.get("dtype") != want:
        c["dtype"] = want
        cj.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    if job.get("mxfp4_experts"):
        write_mxfp4_experts(outdir)
    if job.get("fp8_block"):
        write_fp8_weights(outdir, job["fp8_block"])
    if tokdir is not None:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            src = tokdir / fn
            if src.is_file():
                shutil.copyfile(src, outdir / fn)
            else:
                warnings.warn(f"{tokdir}/{fn} missing; not copied")


def process(job: dict, prompt_source: str) -> dict:
    arch, variant, name = job["arch"], job["dtype"], job["name"]
    spec = ARCHS[arch]
    outdir = OUT_ROOT / name
    tok, tokdir = load_tokenizer(spec["tokenizer"])
    if tok is None:
        warnings.warn(
            f"{name}: tokenizer fixture {TOK_ROOT / spec['tokenizer']} not found; "
            "skipping tokenizer copy and using a random prompt"
        )
    prompt_ids, psrc, ptext = make_prompt(spec, tok, prompt_source, spec["seed"] + 77)

    last_err = None
    for attempt in range(MAX_SEED_TRIES):
        seed = job["seed"] + 1000 * attempt
        build_and_save(job, seed, outdir, tok, tokdir)
        model = load(outdir, torch.float32)
        longrope = model.config.rope_parameters.get("rope_type") == "longrope"
        res = compute_oracle(model, spec, prompt_ids)
        problems = []
        if res["min_margin"] < MIN_MARGIN:
            problems.append(f"min greedy margin {res['min_margin']:.2e}")
        g = res["rstats"].get("min_router_gap")
        if g is not None and g < MIN_ROUTER_GAP:
            problems.append(f"min router gap {g:.2e}")
        if any(i >= TOKEN_ID_LIMIT for i in res["greedy"]):
            problems.append("greedy id >= 1000")
        if len(set(res["greedy"])) < MIN_DISTINCT_GREEDY:
            problems.append(f"only {len(set(res['greedy']))} distinct greedy ids")
        short = None
        if arch == "phimoe" and longrope:
            short = phimoe_short_prompt(model, prompt_ids)
            if short["min_margin"] < MIN_MARGIN:
                problems.append(f"short-prompt margin {short['min_margin']:.2e}")
            if short["rstats"]["min_router_gap"] < MIN_ROUTER_GAP:
                problems.append(f"short-prompt router gap {short['rstats']['min_router_gap']:.2e}")
        if res["clip"] is not None and res["clip"]["clamped_values"] == 0:
            problems.append("clip_qkv never triggers")
        if not problems:
            break
        last_err = "; ".join(problems)
        log(f"  {name}: seed {seed} rejected ({last_err}); reseeding")
    else:
        raise SystemExit(f"{name}: no acceptable seed found ({last_err})")

    # hard self-consistency checks (float32 compute)
    assert res["d_nocache"] < 1e-4, (name, res["d_nocache"])
    assert res["d_recompute"] < 1e-3, (name, res["d_recompute"])
    assert res["d_long"] < 1e-3, (name, res["d_long"])
    assert res["gen_match"], (name, "generate() disagrees with the manual cache loop")
    ref = np_reference_logits(outdir, prompt_ids + res["greedy"][:-1])
    hf_rows = torch.cat([res["prefill"], res["decode"]], 0).double().numpy()
    d_ref = float(np.abs(ref - hf_rows).max())
    assert d_ref < NP_REF_TOL, (name, "numpy reference disagrees with transformers", d_ref)
    d_ref_short = None
    if short is not None:
        n_s = len(short["prompt_ids"])
        # step i sees a sequence of length n_s + i; its mscale regime depends on that length
        seq_s = short["prompt_ids"] + short["greedy_ids"]
        ref_s = np.stack([np_reference_logits(outdir, seq_s[: n_s + i])[-1] for i in range(N_GENERATE)])
        d_ref_short = float(np.abs(ref_s - short["logits"].double().numpy()).max())
        assert d_ref_short < 1e-3, (name, "numpy reference disagrees (short prompt)", d_ref_short)

    odir = outdir / "oracle"
    odir.mkdir(exist_ok=True)
    write_f32(odir / "prefill_logits.f32", res["prefill"])
    write_f32(odir / "decode_logits.f32", res["decode"])
    if job.get("fp8_block"):
        write_e4m3_table(odir / "f8_e4m3_values.f32")

    info: dict = {
        "arch": arch,
        "name": name,
        "architectures": list(model.config.architectures or []),
        "model_type": model.config.model_type,
        "dtype": DTYPE_NAMES[variant],
        "compute_dtype": "float32",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "seed": seed,
        "vocab_size": int(model.config.vocab_size),
        "prompt_source": psrc,
        "prompt_text": ptext,
        "prompt_ids": prompt_ids,
        "n_prompt": len(prompt_ids),
        "n_generate": N_GENERATE,
        "greedy_ids": res["greedy"],
        "prefill_logits": "prefill_logits.f32",
        "prefill_logits_shape": [len(prompt_ids), int(model.config.vocab_size)],
        "decode_logits": "decode_logits.f32",
        "decode_logits_shape": [N_GENERATE - 1, int(model.config.vocab_size)],
        "logits_format": "raw little-endian float32, row-major [rows x vocab_size]",
        "min_greedy_margin": res["min_margin"],
        "greedy_margins": res["margins"],
        "prefill_logit_std": res["logit_std"],
        "router": res["rstats"],
        "self_check": {
            "prefill_nocache_vs_cache_max_abs_diff": res["d_nocache"],
            "cached_decode_vs_full_recompute_max_abs_diff": res["d_recompute"],
            "generate_ids_match": res["gen_match"],
            "generate_logits_vs_cached_max_abs_diff": res["d_generate"],
            "long_cached_decode_vs_full_recompute_max_abs_diff": res["d_long"],
            "long_check_total_len": res["long_total_len"],
            "numpy_f64_reference_vs_oracle_max_abs_diff": d_ref,
        },
        "notes": job["notes"],
        "variant_config": job["overrides"],
    }
    if job["extra"]:
        info["extra_variant"] = True
        if job["drop"]:
            info["variant_config_removed_keys"] = job["drop"]
        if job["init_scale"]:
            info["init_scale"] = job["init_scale"]
        info["attention_layers"] = attention_layer_info(outdir)
        tied = bool(model.config.tie_word_embeddings)
        info["tie_word_embeddings"] = tied
        info["lm_head_weight_in_checkpoint"] = "lm_head.weight" in np_checkpoint_keys(outdir)
    if job.get("fp8_block"):
        info["fp8"] = {
            "weight_block_size": job["fp8_block"],
            "quantized_tensors": sorted(k[: -len("_scale_inv")] for k in np_checkpoint_keys(outdir) if k.endswith("_scale_inv")),
            "oracle": "transformers FineGrainedFP8Config(dequantize=True), float32 weights = e4m3 x scale_inv",
            "e4m3_values": "f8_e4m3_values.f32",
            "e4m3_values_format": "raw little-endian float32 [256]: torch's float8_e4m3fn -> float32 of code i",
        }
    if res["clip"] is not None:
        info["clip_qkv_stats"] = res["clip"]
    if arch == "gpt_oss":
        info["swiglu_clamp_stats"] = {
            "limit": model.config.swiglu_limit,
            "clamped_values": NP_GPT_OSS_CLAMPED[0],
            "total_values": NP_GPT_OSS_CLAMPED[1],
            "note": "gate above limit or |up| above limit, over the NumPy reference's prefill + decode rows",
        }
    if arch == "phimoe" and longrope:
        orig = model.config.rope_parameters["original_max_position_embeddings"]
        n = len(prompt_ids)
        info["rope"] = {
            "original_max_position_embeddings": orig,
            "prefill_mscale": "long_mscale" if n > orig else "short_mscale",
            "decode_mscale": [
                ("long_mscale" if (n + i) + 1 > orig else "short_mscale") for i in range(N_GENERATE - 1)
            ],
            "inv_freq_factors": "short_factor (always; long_factor is unused by transformers 5.23)",
            "rule": "mscale = long_mscale if max(position_ids)+1 > original_max_position_embeddings "
            "in the current forward call else short_mscale; cos and sin (hence q and k) are both "
            "multiplied by mscale",
        }
        write_f32(odir / "short_prompt_logits.f32", short["logits"])
        info["short_prompt"] = {
            "description": "prompt shorter than original_max_position_embeddings; greedy via "
            "model.generate(), which discards the KV cache and recomputes the whole sequence the first "
            "time the sequence length reaches original_max_position_embeddings+1. Row i of "
            "short_prompt_logits.f32 produced greedy_ids[i] (row 0 = last prefill row). These logits "
            "equal a full no-cache recompute of prompt+greedy[:i] at every step.",
            "prompt_ids": short["prompt_ids"],
            "n_prompt": len(short["prompt_ids"]),
            "greedy_ids": short["greedy_ids"],
            "logits": "short_prompt_logits.f32",
            "logits_shape": [N_GENERATE, int(model.config.vocab_size)],
            "min_greedy_margin": short["min_margin"],
            "router": short["rstats"],
            "generate_vs_full_recompute_max_abs_diff": short["d_full"],
            "naive_cache_loop_greedy_ids": short["naive_ids"],
            "naive_cache_loop_matches_generate": short["naive_ids"] == short["greedy_ids"],
            "numpy_f64_reference_vs_oracle_max_abs_diff": d_ref_short,
        }

    # bf16/f16: also the native low-precision compute (prefill only), for information
    if variant != "f32" and not job.get("fp8_block"):
        mb = load(outdir, TORCH_DTYPES[variant])
        with torch.no_grad():
            lb = mb(input_ids=torch.tensor([prompt_ids]), use_cache=False).logits[0].float()
        write_f32(odir / f"prefill_logits_{variant}compute.f32", lb)
        info[f"prefill_logits_{variant}compute"] = f"prefill_logits_{variant}compute.f32"
        info[f"{variant}_compute_max_abs_diff"] = float((lb - res["prefill"]).abs().max())
        info[f"{variant}_compute_last_row_argmax_matches"] = int(lb[-1].argmax()) == res["greedy"][0]
        del mb

    (odir / "oracle.json").write_text(json.dumps(info, indent=2) + "\n")

    files = sorted(p.name for p in outdir.iterdir() if p.is_file())
    nbytes = dir_bytes(outdir)
    if nbytes > MAX_DIR_BYTES:
        raise SystemExit(f"{name}: {nbytes} bytes on disk exceeds {MAX_DIR_BYTES}")
    if nbytes > SOFT_DIR_BYTES:
        warnings.warn(f"{name}: {nbytes} bytes on disk")
    if shard_spec := job["shard"]:
        idx = outdir / "model.safetensors.index.json"
        shards = {v for v in json.loads(idx.read_text())["weight_map"].values()}
        assert len(shards) >= 2, (name, shard_spec, shards)
    return dict(
        name=name,
        params=sum(p.numel() for p in model.parameters()),
        bytes=nbytes,
        std=res["logit_std"],
        margin=res["min_margin"],
        rgap=res["rstats"].get("min_router_gap"),
        d_rec=res["d_recompute"],
        d_ref=d_ref,
        lowp=info.get(f"{variant}_compute_max_abs_diff"),
        files=files,
        seed=seed,
        prompt=psrc,
    )


def main() -> None:
    global OUT_ROOT, TOK_ROOT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--only", nargs="*", help="model names (e.g. mixtral-f32, mixtral-f16) or arch names (all dirs of that arch)"
    )
    ap.add_argument(
        "--set",
        choices=["all", "base", "extra"],
        default="all",
        help="base: the ten ARCHS x f32/bf16 dirs; extra: the EXTRA_VARIANTS dirs; all (default): both",
    )
    ap.add_argument(
        "--prompt-source",
        choices=["auto", "random"],
        default="auto",
        help="auto: tokenize a fixed sentence when the tokenizer fixture exists, else random ids",
    )
    ap.add_argument("--out", type=Path, default=OUT_ROOT, help=f"output root (default {OUT_ROOT})")
    ap.add_argument(
        "--tokenizers", type=Path, default=TOK_ROOT, help=f"tokenizer fixtures root (default {TOK_ROOT})"
    )
    args = ap.parse_args()
    OUT_ROOT, TOK_ROOT = args.out.resolve(), args.tokenizers.resolve()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.simplefilter("default")

    todo = all_jobs()
    if args.set != "all":
        todo = [j for j in todo if j["extra"] == (args.set == "extra")]
    if args.only:
        todo = [j for j in todo if j["arch"] in args.only or j["name"] in args.only]
    OUT_ROOT.mkdir(parents=True, exist_ok=True)
    rows = []
    for job in todo:
        log(f"== {job['name']}")
        rows.append(process(job, args.prompt_source))

    log("")
    hdr = f"{'name':<20}{'params':>9}{'bytes':>10}{'logit std':>10}{'min margin':>11}{'rtr gap':>9}{'recomp':>9}{'np ref':>9}{'lowp diff':>10}  seed  prompt"
    log(hdr)
    log("-" * len(hdr))
    for r in rows:
        bf = f"{r['lowp']:.3g}" if r["lowp"] is not None else "-"
        rg = f"{r['rgap']:.3g}" if r["rgap"] is not None else "-"
        log(
            f"{r['name']:<20}{r['params']:>9}{r['bytes']:>10}{r['std']:>10.3f}{r['margin']:>11.4f}"
            f"{rg:>9}{r['d_rec']:>9.1e}{r['d_ref']:>9.1e}{bf:>10}  {r['seed']:<5} {r['prompt']}"
        )
    total = sum(r["bytes"] for r in rows)
    log(f"total bytes: {total}")


if __name__ == "__main__":
    main()

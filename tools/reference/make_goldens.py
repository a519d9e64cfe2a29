#!/usr/bin/env python3
"""Reference goldens for deltafin: tiny random DeepSeek-V3 / Kimi K2 checkpoints in their real on-disk
encodings (BF16, DeepSeek-V3 FP8 block, Kimi-K2-Thinking INT4 pack-quantized, compressed-tensors MXFP4) plus the
output of transformers' DeepseekV3ForCausalLM run in float64 (experts implementation `eager`).

Runs on the GPU machine (transformers 5.x + torch + safetensors); everything runs on the CPU in float64.
  python3 tools/reference/make_goldens.py --out DIR [--cases a,b]   # writes DIR/<case>/ + DIR/reference_info.json
  python3 tools/reference/make_goldens.py --plan                     # no torch needed: shapes and file sizes

Per case:
  1. canonical checkpoint tensors (names exactly as published checkpoints) from a seeded generator;
  2. encode them (bf16 / fp8 / int4 / mxfp4) and dequantize IN MEMORY from the integer codes;
  3. load that float64 state into DeepseekV3ForCausalLM (from_pretrained of a temporary F64 checkpoint, no missing or
     unexpected keys allowed), run the prompt and 20 greedy steps; retry seeds until the min top-2 margin >= 0.02;
  4. write the case directory (config.json, safetensors [+ index]) with our own writer;
  5. read the files BACK from disk with an independent decoder (unpack nibbles, fp8 casts, block scales), run again:
     the golden comes from this run, and it must equal step 3 bit for bit (catches encoding mistakes);
  6. parse the written config.json with DeepseekV3Config and run again (catches config-key mistakes, e.g. the legacy
     `rope_scaling` key); for bf16 cases also load the case dir directly with from_pretrained.
See tools/reference/README.md.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import time

N_GREEDY = 20
MIN_MARGIN = 0.02
MAX_SEED_TRIES = 16

# ---------------------------------------------------------------------------------------------------------------
# Case definitions (pure python, no torch)
# ---------------------------------------------------------------------------------------------------------------
BASE = dict(
    vocab_size=256, hidden_size=128, intermediate_size=128, moe_intermediate_size=16,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=48, kv_lora_rank=48, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=16,
    n_shared_experts=1, n_routed_experts=12, num_experts_per_tok=3, n_group=1, topk_group=1,
    first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.827,
    hidden_act="silu", rms_norm_eps=1e-6, initializer_range=0.08, tie_word_embeddings=False,
    attention_bias=False, rope_interleave=True, max_position_embeddings=4096,
)
YARN_K2 = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
           "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
YARN_K2_THINKING = dict(YARN_K2, factor=64.0)
YARN_DSV3 = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
             "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}

QC_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
QC_INT4 = {
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                    "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}
QC_MXFP4 = {
    "config_groups": {"group_0": {
        "format": "mxfp4-pack-quantized", "input_activations": None, "output_activations": None,
        "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "scale_dtype": "torch.uint8",
                    "strategy": "group", "symmetric": True, "type": "float", "zp_dtype": None}}},
    "format": "mxfp4-pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}


def case_defs():
    """Every case: HF config kwargs + how it is stored. rope None = plain RoPE (rope_theta only)."""
    c = []
    c.append(dict(
        case="bf16_kimi", seed=1001, model_type="kimi_k2", encoding="bf16", config_key="rope_parameters",
        shards=1, rope=YARN_K2, rope_theta=50000.0,
        description="Kimi K2 style: n_group 1, q_lora, YaRN 32 (K2 mscale 1/1, beta 1/1), norm_topk_prob, "
                    "first_k_dense 1, 1 shared, scaling 2.827, 8 experts top-2, bf16, v5 rope_parameters key",
        hf=dict(n_routed_experts=8, num_experts_per_tok=2, max_position_embeddings=131072)))
    c.append(dict(
        case="bf16_dsv3_groups", seed=2002, model_type="deepseek_v3", encoding="bf16", config_key="rope_parameters",
        shards=1, rope=None, rope_theta=10000.0,
        description="DeepSeek-V3 style: n_group 4, topk_group 2 (groups of 3), NO q_lora (q_proj), no YaRN, "
                    "norm_topk_prob false, scaling 2.5, 12 experts top-3, bf16",
        hf=dict(q_lora_rank=None, n_group=4, topk_group=2, norm_topk_prob=False, routed_scaling_factor=2.5)))
    c.append(dict(
        case="bf16_rope_scaling", seed=3003, model_type="kimi_k2", encoding="bf16", config_key="rope_scaling",
        shards=3, rope=YARN_K2, rope_theta=50000.0,
        description="Like bf16_kimi but config.json uses the published `rope_scaling` key (\"type\": \"yarn\") "
                    "and the weights are sharded (3 shards + model.safetensors.index.json); 8 experts top-3",
        hf=dict(n_routed_experts=8, max_position_embeddings=131072)))
    c.append(dict(
        case="fp8_block", seed=4004, model_type="deepseek_v3", encoding="fp8", config_key="rope_scaling",
        shards=1, rope=YARN_DSV3, rope_theta=10000.0,
        description="DeepSeek-V3 FP8 e4m3 with 128x128 weight_scale_inv blocks (partial blocks: out 48/64/192/160, "
                    "in 48/64/160/48), q_lora, YaRN 40 (beta_fast 32), n_group 4 topk_group 2, 16 experts top-4, "
                    "moe_intermediate 48, first_k_dense 2, scaling 2.5, published-style config",
        hf=dict(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                intermediate_size=160, moe_intermediate_size=48, first_k_dense_replace=2,
                max_position_embeddings=163840)))
    c.append(dict(
        case="int4_experts", seed=5005, model_type="kimi_k2", encoding="int4", config_key="rope_scaling",
        shards=1, rope=YARN_K2_THINKING, rope_theta=50000.0,
        description="Kimi-K2-Thinking: routed experts compressed-tensors pack-quantized INT4 group 32 "
                    "(weight_packed I32, weight_scale BF16, weight_shape I64), rest bf16; YaRN 64, q_lora, "
                    "16 experts top-4, moe_intermediate 32",
        hf=dict(n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
                max_position_embeddings=262144)))
    c.append(dict(
        case="mxfp4_experts", seed=6006, model_type="kimi_k2", encoding="mxfp4", config_key="rope_parameters",
        shards=1, rope=YARN_K2, rope_theta=50000.0,
        description="Routed experts rounded to MXFP4, stored compressed-tensors mxfp4-pack-quantized "
                    "(weight_packed U8 [out,in/2], weight_scale U8 E8M0 [out,in/32]), rest bf16; YaRN 32, "
                    "NO q_lora, 16 experts top-2, moe_intermediate 32",
        hf=dict(q_lora_rank=None, n_routed_experts=16, num_experts_per_tok=2, moe_intermediate_size=32,
                max_position_embeddings=131072)))
    c.append(dict(
        case="bf16_yarn64_groups", seed=7007, model_type="kimi_k2", encoding="bf16", config_key="rope_parameters",
        shards=1, rope=YARN_K2_THINKING, rope_theta=50000.0,
        description="YaRN factor 64 + q_lora + n_group 4 topk_group 2 (groups of 3), norm_topk_prob, "
                    "12 experts top-3, bf16",
        hf=dict(n_group=4, topk_group=2, max_position_embeddings=262144)))
    for d in c:
        kw = dict(BASE)
        kw.update(d["hf"])
        d["kw"] = kw
    return c


def canonical_shapes(kw):
    """[(name, shape, kind)] for the checkpoint, names as in published DeepSeek-V3 / Kimi K2 checkpoints.
    kind: embed, norm, linear, gate, bias, expert, shared, dense, head."""
    H, V = kw["hidden_size"], kw["vocab_size"]
    nh = kw["num_attention_heads"]
    qk = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
    out = [("model.embed_tokens.weight", (V, H), "embed")]
    for i in range(kw["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out.append((p + "input_layernorm.weight", (H,), "norm"))
        out.append((p + "post_attention_layernorm.weight", (H,), "norm"))
        a = p + "self_attn."
        if kw["q_lora_rank"]:
            out.append((a + "q_a_proj.weight", (kw["q_lora_rank"], H), "linear"))
            out.append((a + "q_a_layernorm.weight", (kw["q_lora_rank"],), "norm"))
            out.append((a + "q_b_proj.weight", (nh * qk, kw["q_lora_rank"]), "linear"))
        else:
            out.append((a + "q_proj.weight", (nh * qk, H), "linear"))
        out.append((a + "kv_a_proj_with_mqa.weight", (kw["kv_lora_rank"] + kw["qk_rope_head_dim"], H), "linear"))
        out.append((a + "kv_a_layernorm.weight", (kw["kv_lora_rank"],), "norm"))
        out.append((a + "kv_b_proj.weight", (nh * (kw["qk_nope_head_dim"] + kw["v_head_dim"]), kw["kv_lora_rank"]),
                    "linear"))
        out.append((a + "o_proj.weight", (H, nh * kw["v_head_dim"]), "linear"))
        m = p + "mlp."
        if i < kw["first_k_dense_replace"]:
            I = kw["intermediate_size"]
            out += [(m + "gate_proj.weight", (I, H), "dense"), (m + "up_proj.weight", (I, H), "dense"),
                    (m + "down_proj.weight", (H, I), "dense")]
        else:
            E, I = kw["n_routed_experts"], kw["moe_intermediate_size"]
            out.append((m + "gate.weight", (E, H), "gate"))
            out.append((m + "gate.e_score_correction_bias", (E,), "bias"))
            for e in range(E):
                q = m + "experts.%d." % e
                out += [(q + "gate_proj.weight", (I, H), "expert"), (q + "up_proj.weight", (I, H), "expert"),
                        (q + "down_proj.weight", (H, I), "expert")]
            Is = I * kw["n_shared_experts"]
            q = m + "shared_experts."
            out += [(q + "gate_proj.weight", (Is, H), "shared"), (q + "up_proj.weight", (Is, H), "shared"),
                    (q + "down_proj.weight", (H, Is), "shared")]
    out.append(("model.norm.weight", (H,), "norm"))
    out.append(("lm_head.weight", (V, H), "head"))
    return out


def stored_bytes(case):
    """Bytes of tensor data the case's safetensors will hold (headers excluded)."""
    n = 0
    for name, shape, kind in canonical_shapes(case["kw"]):
        numel = math.prod(shape)
        enc = case["encoding"]
        if kind == "bias":
            n += 4 * numel
        elif enc == "fp8" and kind in ("linear", "dense", "expert", "shared"):
            n += numel + 4 * math.ceil(shape[0] / 128) * math.ceil(shape[1] / 128)
        elif enc == "int4" and kind == "expert":
            n += numel // 2 + 2 * numel // 32 + 16
        elif enc == "mxfp4" and kind == "expert":
            n += numel // 2 + numel // 32
        else:
            n += 2 * numel
    return n


def plan():
    tot = 0
    for c in case_defs():
        kw = c["kw"]
        print("%-20s %-6s E=%2d top%d groups=%d/%d q_lora=%s yarn=%s data=%7d bytes" % (
            c["case"], c["encoding"], kw["n_routed_experts"], kw["num_experts_per_tok"], kw["n_group"],
            kw["topk_group"], kw["q_lora_rank"], c["rope"]["factor"] if c["rope"] else None, stored_bytes(c)))
        assert stored_bytes(c) < 1_900_000, c["case"]
        tot += stored_bytes(c) + 24 * 10 * c["kw"]["vocab_size"] + 8000
        assert kw["n_routed_experts"] % kw["n_group"] == 0
        assert kw["topk_group"] * kw["n_routed_experts"] // kw["n_group"] >= kw["num_experts_per_tok"]
    print("estimated total with goldens: %d bytes" % tot)
    assert tot < 7_600_000


# ---------------------------------------------------------------------------------------------------------------
# Everything below needs torch / transformers / safetensors (GPU machine)
# ---------------------------------------------------------------------------------------------------------------
def main_torch(args):
    import torch
    import transformers
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True, warn_only=True)
    versions = {"transformers_version": transformers.__version__, "torch_version": torch.__version__}
    print("versions:", versions, flush=True)

    # ---------------- encoders (in memory; return stored tensors AND the dequantized float64 weight) -----------
    def enc_bf16(w):
        s = w.to(torch.bfloat16)
        return {"": s}, s.to(torch.float64)

    def round_up_bf16(x):
        """smallest bf16 value >= x (x: positive python float holding a float32 value); keeps fp8*scale exact
        in float32 (4-bit x 8-bit significands)."""
        bits = struct.unpack("<I", struct.pack("<f", x))[0]
        if bits & 0xFFFF:
            bits = (bits & 0xFFFF0000) + 0x10000
        return struct.unpack("<f", struct.pack("<I", bits))[0]

    def enc_fp8(w):
        out_, in_ = w.shape
        ro, ri = math.ceil(out_ / 128), math.ceil(in_ / 128)
        scale = torch.empty(ro, ri, dtype=torch.float32)
        qf = torch.empty(out_, in_, dtype=torch.float32)      # fp8 values held in float32 (exact)
        deq = torch.empty(out_, in_, dtype=torch.float64)
        for bi in range(ro):
            for bj in range(ri):
                blk = w[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128].to(torch.float32)
                amax = blk.abs().max().clamp(min=1e-12)
                s = round_up_bf16(float(amax / 448.0))
                qb = (blk / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)  # RNE to e4m3
                qf[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128] = qb
                scale[bi, bj] = s
                deq[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128] = qb.to(torch.float64) * s
        q = qf.to(torch.float8_e4m3fn)
        if not torch.equal(q.to(torch.float32), qf):
            raise RuntimeError("fp8 values did not survive the cast")
        return {"": q, ".weight_scale_inv": scale}, deq

    def enc_int4(w):
        out_, in_ = w.shape
        g = w.to(torch.float32).reshape(out_, in_ // 32, 32)
        amax = g.abs().amax(dim=2).clamp(min=1e-12)
        scale = (amax / 7.5).to(torch.bfloat16)                       # compressed-tensors symmetric: amax/(15/2)
        sf = scale.to(torch.float32).unsqueeze(2)
        q = torch.round(g / sf).clamp(-8, 7).to(torch.int64)          # round half to even
        deq = (q.to(torch.float64) * sf.to(torch.float64)).reshape(out_, in_)
        u = (q + 8).reshape(out_, in_)                                # stored as q+8, 0..15
        packed = torch.zeros(out_, in_ // 8, dtype=torch.int64)
        for j in range(8):
            packed |= u[:, j::8] << (4 * j)                           # element j -> bits 4j..4j+3
        packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)
        return {"_packed": packed, "_scale": scale, "_shape": torch.tensor([out_, in_], dtype=torch.int64)}, deq

    FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)

    def enc_mxfp4(w):
        out_, in_ = w.shape
        g = w.to(torch.float64).reshape(out_, in_ // 32, 32)
        amax = g.abs().amax(dim=2)
        e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=1e-300))) - 2, torch.full_like(amax, -127))
        e = e.clamp(-127, 127)
        x = g / torch.pow(2.0, e).unsqueeze(2)
        mag = x.abs().clamp(max=6.0)
        code = (mag.unsqueeze(3) - FP4).abs().argmin(dim=3)           # nearest; ties -> smaller magnitude
        sign = (x < 0) & (code > 0)
        nib = (code + 8 * sign.to(torch.int64)).reshape(out_, in_)
        packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8)  # low nibble = even element
        sbyte = (e + 127).to(torch.uint8)
        val = FP4[code] * torch.where(sign, -1.0, 1.0)
        deq = (val * torch.pow(2.0, e).unsqueeze(2)).reshape(out_, in_)
        return {"_packed": packed, "_scale": sbyte}, deq

    # ---------------- decoders (from what was read back from disk) ----------------------------------------------
    def dec_fp8(q, s):
        out_, in_ = q.shape
        sf = s.to(torch.float64).repeat_interleave(128, 0)[:out_].repeat_interleave(128, 1)[:, :in_]
        return q.to(torch.float32).to(torch.float64) * sf

    def dec_int4(packed, scale, shape):
        out_, in_ = [int(v) for v in shape.tolist()]
        p = packed.to(torch.int64) & 0xFFFFFFFF
        nib = torch.stack([(p >> (4 * j)) & 0xF for j in range(8)], dim=2).reshape(out_, in_)
        sf = scale.to(torch.float64).repeat_interleave(32, 1)
        return (nib - 8).to(torch.float64) * sf

    def dec_mxfp4(packed, sbyte):
        out_ = packed.shape[0]
        in_ = packed.shape[1] * 2
        p = packed.to(torch.int64)
        nib = torch.stack([p & 0xF, p >> 4], dim=2).reshape(out_, in_)
        mag = FP4[nib & 7]
        val = torch.where(nib >= 8, -mag, mag)
        sf = torch.pow(2.0, sbyte.to(torch.float64) - 127).repeat_interleave(32, 1)
        return val * sf

    # ---------------- checkpoint tensors -------------------------------------------------------------------------
    def make_weights(case, seed):
        kw = case["kw"]
        g = torch.Generator().manual_seed(seed)
        std = kw["initializer_range"]
        w = {}
        for name, shape, kind in canonical_shapes(kw):
            if kind == "norm":
                t = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float32)
            elif kind == "bias":   # >= 0 keeps every selection score > 0: group masking with 0.0 == with -inf
                t = 0.12 * torch.rand(shape, generator=g, dtype=torch.float32)
            elif kind == "head":
                t = 0.25 * torch.randn(shape, generator=g, dtype=torch.float32)
            else:
                t = std * torch.randn(shape, generator=g, dtype=torch.float32)
            w[name] = (t, kind)
        return w

    def encode(case, weights):
        """-> (stored {name: tensor}, dequantized float64 {canonical name: tensor})"""
        enc = case["encoding"]
        stored, deq = {}, {}
        for name, (t, kind) in weights.items():
            base = name[:-len(".weight")] if name.endswith(".weight") else name
            if kind == "bias":
                stored[name] = t.to(torch.float32)
                deq[name] = t.to(torch.float64)
                continue
            if enc == "fp8" and kind in ("linear", "dense", "expert", "shared"):
                parts, d = enc_fp8(t)
                stored[name] = parts[""]
                stored[name + "_scale_inv"] = parts[".weight_scale_inv"]
            elif enc == "int4" and kind == "expert":
                parts, d = enc_int4(t)
                for suf, v in parts.items():
                    stored[base + ".weight" + suf] = v
            elif enc == "mxfp4" and kind == "expert":
                parts, d = enc_mxfp4(t)
                for suf, v in parts.items():
                    stored[base + ".weight" + suf] = v
            else:
                parts, d = enc_bf16(t)
                stored[name] = parts[""]
            # sanity: a dequantized weight stays near the original (a wrong nibble order or scale would not)
            frac = {"bf16": 0.01, "fp8": 0.07, "int4": 0.07, "mxfp4": 0.26}[enc if len(parts) > 1 else "bf16"]
            err = float((d - t.to(torch.float64)).abs().max())
            if err > frac * float(t.abs().max()):
                raise RuntimeError("%s: encoding error %g too large for amax %g" % (name, err, float(t.abs().max())))
            deq[name] = d
        return stored, deq

    def decode_from_disk(case, tensors):
        """Independent path: dequantize what was read back from the files."""
        deq = {}
        names = set(tensors)
        for name, shape, kind in canonical_shapes(case["kw"]):
            base = name[:-len(".weight")] if name.endswith(".weight") else name
            if name in names and (name + "_scale_inv") in names:
                d = dec_fp8(tensors[name], tensors[name + "_scale_inv"])
            elif name in names:
                t = tensors[name]
                d = t.to(torch.float32).to(torch.float64) if t.dtype != torch.float64 else t
            elif base + ".weight_packed" in names and base + ".weight_shape" in names:
                d = dec_int4(tensors[base + ".weight_packed"], tensors[base + ".weight_scale"],
                             tensors[base + ".weight_shape"])
            elif base + ".weight_packed" in names:
                d = dec_mxfp4(tensors[base + ".weight_packed"], tensors[base + ".weight_scale"])
            else:
                raise RuntimeError("tensor %s missing from the written checkpoint" % name)
            if tuple(d.shape) != tuple(shape):
                raise RuntimeError("tensor %s decoded to shape %s, expected %s" % (name, tuple(d.shape), shape))
            deq[name] = d
        return deq

    # ---------------- configs ------------------------------------------------------------------------------------
    def hf_config(case):
        """DeepseekV3Config of the case; tries the v5 `rope_parameters` kwarg, then the legacy `rope_scaling`, and
        keeps the first whose parsed rope parameters say exactly what the case means."""
        errs = []
        want = dict(case["rope"] or {"rope_type": "default"}, rope_theta=case["rope_theta"])
        for variant in ("rope_parameters", "rope_scaling"):
            kw = dict(case["kw"])
            if variant == "rope_parameters":
                kw["rope_parameters"] = dict(want)
            else:
                kw["rope_theta"] = case["rope_theta"]
                if case["rope"]:
                    kw["rope_scaling"] = dict(case["rope"])
            try:
                cfg = DeepseekV3Config(**kw)
            except Exception as ex:
                errs.append("%s: %r" % (variant, ex))
                continue
            rp = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
            rp.setdefault("rope_theta", getattr(cfg, "rope_theta", None))
            if "type" in rp and "rope_type" not in rp:
                rp["rope_type"] = rp["type"]
            bad = [k for k in want if rp.get(k) is None or
                   (rp.get(k) != want[k] if isinstance(want[k], str) else float(rp.get(k)) != float(want[k]))]
            if not bad:
                print("  config via %s: rope_parameters %r" % (variant, rp), flush=True)
                case["config_variant"] = variant
                return cfg
            errs.append("%s: parsed %r, wrong %r" % (variant, rp, bad))
        raise RuntimeError("%s: no config variant gives the intended rope parameters: %s" % (case["case"], errs))

    def case_config_json(case, cfg):
        d = cfg.to_dict()
        for k in ("transformers_version", "_name_or_path", "dtype", "torch_dtype", "output_attentions",
                  "output_hidden_states", "return_dict", "use_cache", "_experts_implementation",
                  "_attn_implementation", "experts_implementation", "attn_implementation"):
            d.pop(k, None)
        d["architectures"] = ["DeepseekV3ForCausalLM"]
        d["model_type"] = case["model_type"]
        d["use_cache"] = True
        rp = dict(d.get("rope_parameters") or {})
        rp.setdefault("rope_theta", case["rope_theta"])
        rp.setdefault("rope_type", "default")
        d.pop("rope_scaling", None)
        d.pop("rope_theta", None)
        d["rope_parameters"] = rp
        if case["config_key"] == "rope_scaling":
            rp = dict(d.pop("rope_parameters", {}) or {})
            d["rope_theta"] = rp.pop("rope_theta", case["rope_theta"])
            if case["rope"]:
                rp.pop("rope_type", None)
                d["rope_scaling"] = dict({"type": "yarn"}, **{k: case["rope"][k] for k in case["rope"]
                                                             if k != "rope_type"})
            else:
                d["rope_scaling"] = None
            d["torch_dtype"] = "bfloat16"
        else:
            d["dtype"] = "bfloat16"
        if case["encoding"] == "fp8":
            d["quantization_config"] = QC_FP8
        elif case["encoding"] == "int4":
            d["quantization_config"] = QC_INT4
        elif case["encoding"] == "mxfp4":
            d["quantization_config"] = QC_MXFP4
        return d

    def config_from_json(d):
        d = dict(d)
        for k in ("model_type", "architectures", "quantization_config", "dtype", "torch_dtype"):
            d.pop(k, None)
        return DeepseekV3Config(**d)

    # ---------------- model runs ---------------------------------------------------------------------------------
    def set_eager(model):
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")
        else:
            model.config._experts_implementation = "eager"
        model.eval()

    def load_model(cfg, deq, dtype=torch.float64):
        tmp = tempfile.mkdtemp(prefix="dfref_")
        try:
            cfg.save_pretrained(tmp)
            save_file({k: v.to(dtype).contiguous() for k, v in deq.items()},
                      os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            model, info = DeepseekV3ForCausalLM.from_pretrained(
                tmp, config=cfg, dtype=dtype, attn_implementation="eager", output_loading_info=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if bad:
            raise RuntimeError("loading info not clean: %r" % (bad,))
        set_eager(model)
        sd = model.state_dict()
        for k, v in deq.items():   # every non-fused tensor must hold exactly what we gave it
            if k in sd and not torch.equal(sd[k].to(torch.float64), v.to(dtype).to(torch.float64)):
                raise RuntimeError("parameter %s did not load exactly" % k)
        return model

    def run_model(model, prompt):
        ids = torch.tensor([prompt], dtype=torch.long)
        logits = model(input_ids=ids, use_cache=False).logits[0].to(torch.float64)
        prompt_logits = logits.clone()
        greedy, margins = [], []
        seq = list(prompt)
        last = logits[-1]
        for _ in range(N_GREEDY):
            top = torch.topk(last, 2)
            tok = int(top.indices[0])
            greedy.append(tok)
            margins.append(float(top.values[0] - top.values[1]))
            seq.append(tok)
            last = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].to(torch.float64)
        return prompt_logits, greedy, margins

    def write_safetensors(path, tensors):
        tmp = path + ".tmp"
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={"format": "pt"})
        os.replace(tmp, path)

    def write_json(path, obj, indent=2):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=indent)
            f.write("\n")
        os.replace(tmp, path)

    def write_checkpoint(case, cdir, stored):
        names = list(stored)
        if case["shards"] == 1:
            write_safetensors(os.path.join(cdir, "model.safetensors"), stored)
            return ["model.safetensors"]
        n = case["shards"]
        total = sum(t.numel() * t.element_size() for t in stored.values())
        per = total / n
        files, wm, cur, acc = [], {}, [], 0
        groups = []
        for k in names:
            cur.append(k)
            acc += stored[k].numel() * stored[k].element_size()
            if acc >= per * (len(groups) + 1) and len(groups) < n - 1:
                groups.append(cur)
                cur = []
        groups.append(cur)
        assert len(groups) == n and all(groups)
        for i, grp in enumerate(groups):
            fn = "model-%05d-of-%05d.safetensors" % (i + 1, n)
            write_safetensors(os.path.join(cdir, fn), {k: stored[k] for k in grp})
            for k in grp:
                wm[k] = fn
            files.append(fn)
        write_json(os.path.join(cdir, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total}, "weight_map": wm})
        return files + ["model.safetensors.index.json"]

    def read_checkpoint(cdir):
        out = {}
        idx = os.path.join(cdir, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for fn in files:
            with safe_open(os.path.join(cdir, fn), framework="pt") as f:
                for k in f.keys():
                    if k in out:
                        raise RuntimeError("tensor %s in two shards" % k)
                    out[k] = f.get_tensor(k)
        return out

    def maxdiff(a, b):
        return float((a - b).abs().max())

    # ---------------- reference quirks probe ---------------------------------------------------------------------
    def probe(info):
        import inspect
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mod
        src = {}
        for cname in ("DeepseekV3TopkRouter", "DeepseekV3MoE"):
            cls = getattr(mod, cname, None)
            if cls is not None:
                lines = inspect.getsource(cls).splitlines()
                src[cname] = [l for l in lines if any(s in l for s in (
                    "masked_fill", "float32", "gather", "e_score_correction_bias", "norm_topk_prob", "denominator",
                    "routed_scaling_factor", "sigmoid", "def "))]
        info["router_source_lines"] = src
        for cname, lines in src.items():
            print("  %s:" % cname)
            for l in lines:
                print("    " + l.rstrip())
        # functional probe: all selection scores negative -> a 0.0 mask would pick experts of dropped groups
        kw = dict(BASE, n_routed_experts=12, n_group=4, topk_group=2, num_experts_per_tok=3, num_hidden_layers=2,
                  norm_topk_prob=True, routed_scaling_factor=2.0)
        cfg = DeepseekV3Config(**kw)
        torch.manual_seed(0)
        m = DeepseekV3ForCausalLM(cfg).to(torch.float64).eval()
        moe = m.model.layers[1].mlp
        moe.gate.e_score_correction_bias.fill_(-1.0)
        moe.gate.e_score_correction_bias[11] = -0.999     # group 3 best single; groups 0,1 best pairs
        logits = torch.tensor([[3.0, 2.9, -5.0, 2.8, 2.7, -5.0, -5.0, -5.0, -5.0, -5.0, -5.0, 0.0]],
                              dtype=torch.float64)
        def route(lg):
            """(indices, weights) of one token whose router logits are lg [1, 12]."""
            if hasattr(moe, "route_tokens_to_experts"):
                return moe.route_tokens_to_experts(lg)
            # transformers 5.17: the router module routes; make its logits equal lg (identity rows)
            moe.gate.weight.zero_()
            for e in range(12):
                moe.gate.weight[e, e] = 1.0
            h = torch.zeros(1, kw["hidden_size"], dtype=torch.float64)
            h[0, :12] = lg[0]
            out = moe.gate(h)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            ii = [o for o in outs if torch.is_tensor(o) and not o.is_floating_point()]
            ww = [o for o in outs if torch.is_tensor(o) and o.is_floating_point() and o.shape[-1] == 3]
            if not ii or not ww:
                raise RuntimeError("router output not understood: %r" % ([tuple(o.shape) for o in outs],))
            return ii[0], ww[0]

        try:
            idx, wts = route(logits)
            idx = sorted(int(i) for i in idx[0])
            s = torch.sigmoid(logits[0].to(torch.float32)).to(torch.float64)
            allowed = {0, 1, 2, 3, 4, 5}
            info["probe_selected"] = idx
            info["group_mask_value"] = "-inf (dropped groups never chosen)" if set(idx) <= allowed else \
                "0.0 (dropped groups chosen when kept scores are negative: issue #45440)"
            wsel = sorted(((int(i), float(w)) for i, w in zip(*[x[0] for x in route(logits)])))
            exp_unb = [float(s[i] / s[idx].sum() * 2.0) for i in idx]
            exp_b = [float((s[i] - 1.0) / (s[idx] - 1.0).sum() * 2.0) for i in idx]
            got = [w for _, w in wsel]
            info["probe_weights"] = got
            du = max(abs(a - b) for a, b in zip(got, exp_unb))
            db = max(abs(a - b) for a, b in zip(got, exp_b))
            info["bias_in_weights"] = "undetermined by this probe" if du < 1e-5 and db < 1e-5 else \
                "no (weights from unbiased sigmoid)" if du < 1e-5 else \
                ("YES (bias leaks into weights: PR #40132)" if db < 1e-5 else "unknown (%g / %g)" % (du, db))
            info["router_weight_dtype"] = str(wts.dtype)
        except Exception as ex:  # report, do not fail the goldens
            info["probe_error"] = repr(ex)
        print("  probe:", {k: v for k, v in info.items() if k != "router_source_lines"}, flush=True)

    # ---------------- per case -----------------------------------------------------------------------------------
    def yarn_inv_freq_ref(case):
        d = case["kw"]["qk_rope_head_dim"]
        th = case["rope_theta"]
        f = [th ** (-(2 * i) / d) for i in range(d // 2)]
        if not case["rope"]:
            return f
        r = case["rope"]
        fac, om = r["factor"], r["original_max_position_embeddings"]

        def corr(rot):
            return d * math.log(om / (2 * math.pi * rot)) / (2 * math.log(th))
        lo = max(math.floor(corr(r["beta_fast"])), 0)
        hi = min(math.ceil(corr(r["beta_slow"])), d - 1)
        if lo == hi:
            hi += 0.001
        out = []
        for i in range(d // 2):
            ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
            extrap = 1.0 - ramp
            out.append(f[i] / fac * (1 - extrap) + f[i] * extrap)
        return out

    def facts(case, model, res):
        attn = model.model.layers[0].self_attn
        qk = case["kw"]["qk_nope_head_dim"] + case["kw"]["qk_rope_head_dim"]
        m2 = 1.0
        if case["rope"]:
            m = 0.1 * case["rope"]["mscale_all_dim"] * math.log(case["rope"]["factor"]) + 1.0
            m2 = m * m
        res["softmax_scale_expected"] = qk ** -0.5 * m2
        res["softmax_scale"] = float(attn.scaling)
        res["rope_attention_scaling"] = float(getattr(model.model.rotary_emb, "attention_scaling", 1.0))
        inv = [float(x) for x in model.model.rotary_emb.inv_freq]
        ref = yarn_inv_freq_ref(case)
        res["inv_freq_rel_diff_vs_notes"] = max(abs(a - b) / b for a, b in zip(inv, ref))
        # fused expert tensors must hold the per-expert checkpoint tensors (gate rows first, then up)
        ex = model.model.layers[case["kw"]["first_k_dense_replace"]].mlp.experts
        res["experts_module"] = type(ex).__name__ + ":" + ",".join(
            "%s%s" % (n, tuple(p.shape)) for n, p in ex.named_parameters())

    def do_case(case, outdir, info):
        t0 = time.time()
        name = case["case"]
        cfg = hf_config(case)
        rng = torch.Generator().manual_seed(case["seed"] * 7 + 1)
        prompt = [int(x) for x in torch.randint(1, case["kw"]["vocab_size"], (10,), generator=rng)]
        best = None
        for t in range(MAX_SEED_TRIES):
            seed = case["seed"] + t
            weights = make_weights(case, seed)
            stored, deq = encode(case, weights)
            model = load_model(cfg, deq)
            pl, greedy, margins = run_model(model, prompt)
            mm = min(margins)
            print("  %s seed %d: min margin %.4f" % (name, seed, mm), flush=True)
            if best is None or mm > best[0]:
                best = (mm, seed, stored, deq, pl, greedy, margins, model)
            if mm >= MIN_MARGIN:
                break
        mm, seed, stored, deq_mem, pl_mem, greedy_mem, margins_mem, model = best
        res = {"case": name, "seed": seed, "min_margin": mm, "seed_tries": t + 1,
               "config_variant": case.get("config_variant"),
               "experts_implementation": getattr(getattr(model, "config", None), "_experts_implementation", None)}

        # reference facts of this model
        try:
            facts(case, model, res)
        except Exception as ex:
            res["facts_error"] = repr(ex)

        # write the checkpoint

        cdir = os.path.join(outdir, name)
        shutil.rmtree(cdir, ignore_errors=True)
        os.makedirs(cdir)
        cj = case_config_json(case, cfg)
        write_json(os.path.join(cdir, "config.json"), cj)
        files = write_checkpoint(case, cdir, stored)

        # read back from disk (independent decoder) and compute the golden from that
        back = read_checkpoint(cdir)
        if set(back) != set(stored):
            raise RuntimeError("written tensor set differs: %r" % (set(back) ^ set(stored)))
        for k, v in stored.items():
            if back[k].dtype != v.dtype or tuple(back[k].shape) != tuple(v.shape):
                raise RuntimeError("%s: dtype/shape changed on disk" % k)
        deq_disk = decode_from_disk(case, back)
        for k in deq_mem:
            if not torch.equal(deq_disk[k], deq_mem[k]):
                raise RuntimeError("%s: disk decode != in-memory dequantization (max %g)" %
                                   (k, maxdiff(deq_disk[k], deq_mem[k])))
        model_disk = load_model(cfg, deq_disk)
        pl, greedy, margins = run_model(model_disk, prompt)
        res["reload_max_diff"] = maxdiff(pl, pl_mem)
        if res["reload_max_diff"] > 1e-12 or greedy != greedy_mem:
            raise RuntimeError("%s: reloaded checkpoint gives different logits (%g)" % (name, res["reload_max_diff"]))

        # config.json as written, parsed by transformers, must describe the same model
        with open(os.path.join(cdir, "config.json")) as f:
            cfg_json = config_from_json(json.load(f))
        pl_j, greedy_j, _ = run_model(load_model(cfg_json, deq_disk), prompt)
        res["config_json_max_diff"] = maxdiff(pl_j, pl)
        if res["config_json_max_diff"] > 1e-12 or greedy_j != greedy:   # a reference quirk: report, keep going
            res["WARN_config_json"] = "written config.json parses to a different model in transformers (%g)" % \
                res["config_json_max_diff"]
            print("  WARN %s: %s" % (name, res["WARN_config_json"]), flush=True)
        if case["encoding"] == "bf16":    # transformers' own loader on the case directory itself
          try:
            md, inf2 = DeepseekV3ForCausalLM.from_pretrained(cdir, config=cfg_json, dtype=torch.float64,
                                                             attn_implementation="eager", output_loading_info=True)
            if any(inf2.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
                raise RuntimeError("%s: direct load not clean: %r" % (name, inf2))
            set_eager(md)
            pl_d, greedy_d, _ = run_model(md, prompt)
            res["direct_load_max_diff"] = maxdiff(pl_d, pl)
            if res["direct_load_max_diff"] > 1e-12 or greedy_d != greedy:
                raise RuntimeError("%s: direct from_pretrained differs (%g)" % (name, res["direct_load_max_diff"]))
          except Exception as ex:
            res["WARN_direct_load"] = repr(ex)
            print("  WARN %s: direct load: %r" % (name, ex), flush=True)

        # float32 run of the same weights: how far a correct fp32 engine may land
        m32 = load_model(cfg, deq_disk, dtype=torch.float32)
        pl32, greedy32, _ = run_model(m32, prompt)
        res["f32_prompt_max_diff"] = maxdiff(pl32, pl)
        res["f32_greedy_equal"] = greedy32 == greedy

        golden = {
            "case": name, "description": case["description"], "prompt_ids": prompt,
            "prompt_logits": [[float(x) for x in row] for row in pl.tolist()],
            "greedy_ids": greedy, "greedy_margins": margins,
            "transformers_version": versions["transformers_version"], "torch_version": versions["torch_version"],
            "max_logit_abs": float(pl.abs().max()),
            "dtype": "float64", "experts_implementation": "eager", "attn_implementation": "eager",
            "encoding": case["encoding"], "seed": seed, "files": ["config.json"] + files,
            "min_margin": min(margins), "f32_prompt_max_diff": res["f32_prompt_max_diff"],
            "checks": {k: res[k] for k in ("reload_max_diff", "config_json_max_diff", "direct_load_max_diff")
                       if k in res},
        }
        write_json(os.path.join(cdir, "golden.json"), golden, indent=None)
        res["bytes"] = sum(os.path.getsize(os.path.join(cdir, f)) for f in os.listdir(cdir))
        res["greedy_ids"] = greedy
        res["seconds"] = round(time.time() - t0, 2)
        info["cases"][name] = res
        print("  %s done: %r" % (name, res), flush=True)

    # ---------------- main ---------------------------------------------------------------------------------------
    os.makedirs(args.out, exist_ok=True)
    info = dict(versions)
    info["has_set_experts_implementation"] = hasattr(DeepseekV3ForCausalLM, "set_experts_implementation")
    info["cases"] = {}
    info["failed"] = {}
    torch.set_num_threads(8)
    print("probe of the reference router:", flush=True)
    try:
        probe(info)
    except Exception as ex:
        info["probe_error"] = repr(ex)
        print("  probe failed: %r" % ex, flush=True)
    want = set(args.cases.split(",")) if args.cases else None
    for case in case_defs():
        if want and case["case"] not in want:
            continue
        print("case %s" % case["case"], flush=True)
        try:
            do_case(case, args.out, info)
        except Exception as ex:
            import traceback
            traceback.print_exc()
            info["failed"][case["case"]] = repr(ex)
    write_json(os.path.join(args.out, "reference_info.json"), info)

    print("\n%-20s %-6s %5s %9s %8s %10s %10s %9s %s" % ("case", "enc", "seed", "min_marg", "bytes",
                                                     "reload", "f32_dev", "maxlogit", "greedy_ids"))
    for name, r in info["cases"].items():
        with open(os.path.join(args.out, name, "golden.json")) as f:
            g = json.load(f)
        print("%-20s %-6s %5d %9.4f %8d %10.3g %10.3g %9.3f %s" % (
            name, g["encoding"], r["seed"], r["min_margin"], r["bytes"], r["reload_max_diff"],
            r["f32_prompt_max_diff"], g["max_logit_abs"], ",".join(map(str, r["greedy_ids"]))))
    for name, err in info["failed"].items():
        print("FAILED %s: %s" % (name, err))
    return 1 if info["failed"] else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--cases", default="", help="comma-separated subset")
    ap.add_argument("--plan", action="store_true", help="print shapes and sizes only (no torch)")
    args = ap.parse_args()
    plan()
    if args.plan:
        return 0
    return main_torch(args)


if __name__ == "__main__":
    sys.exit(main())

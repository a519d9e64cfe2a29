#!/usr/bin/env python3
"""Train, export and check deltafin's default model (issue 5): a scaled-down Kimi K2.

Runs on the GPU machine (PyTorch, transformers 5.x DeepseekV3ForCausalLM, tokenizers,
safetensors). Deterministic given --seed and --steps (data order, init, tokenizer);
GPU kernels (grouped_mm backward, atomics) may still differ in the last bits.
When --steps is 0 the step count is derived from --train-seconds after timing the
first steps; the log prints the count so a rerun can pass it with --steps.

Stages (all outputs under --out):
 1. corpus: <data>/train.txt.xz, heldout.txt.xz (tools/train/build_corpus.sh; 0x1E-separated docs)
 2. tokenizer: byte-level BPE (HF tokenizers), --vocab total ids incl. Kimi chat specials at the
    end; tokenizer_config.json carries the Kimi K2 Instruct chat template (tools/train/kimi-k2-chat-template.jinja)
 3. model: DeepseekV3 config in Kimi K2's shape (MLA with q_lora/kv_lora, 64 routed experts top-8,
    1 shared, first layer dense, sigmoid noaux_tc, n_group 1, YaRN factor 32 / orig 4096 /
    beta_fast 1 / beta_slow 1 / mscale 1 / mscale_all_dim 1). bf16 weights with fp32 master copies
    (AdamW), routers kept in fp32, experts through grouped_mm. Loss-free balancing: after every step
    e_score_correction_bias += u * sign(mean_load - load) (no gradient). For the last --qat-frac of
    steps the bf16 routed-expert weights are the MXFP4 rounding of the fp32 masters (straight-through:
    gradients w.r.t. the rounded weights update the masters), so the final experts are exactly MXFP4.
    A tiny dense draft model (same family, all layers dense) trains interleaved on the same batches.
 4. export: experts in compressed-tensors mxfp4-pack-quantized (weight_packed U8 [out,in/2], low
    nibble = even element; weight_scale U8 E8M0 [out,in/32]); router bias F32; everything else bf16;
    shards < --shard-mb; model.safetensors.index.json; verified lossless by reloading.
 5. eval: held-out loss/ppl vs a unigram baseline, expert usage per layer (entropy, min), samples.
 6. goldens: float64, eager experts, on the exported weights reloaded from the files: prompt ids,
    logits at all prompt positions, 32 greedy ids and top-2 margins.
"""
import argparse
import json
import lzma
import math
import os
import re
import shutil
import sys
import tarfile
import time

import numpy as np
import torch
import torch.nn.functional as F

SEP = "\x1e"
# Kimi K2's named special tokens, in Kimi's id order (reserved ones omitted); appended after BPE.
SPECIALS = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
            "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
            "<|tool_call_end|>", "<|im_middle|>", "[UNK]", "[PAD]"]
# Candidates for the 5 shipped goldens (the 5 with the largest smallest greedy margin are kept locally).
GOLDEN_PROMPTS = [
    ("kjv", "In the beginning God created the heaven and the earth. And the earth was"),
    ("python", "The os module provides a portable way of using"),
    ("c_main", "#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n"),
    ("manpage", "The malloc() function allocates size bytes and returns a pointer to"),
    ("dictionary", "Abandon (v. t.): To give up wholly; to"),
    ("kernel", "static int __init init_module(void)\n{\n\tint ret;\n\n"),
    ("psalm", "The LORD is my shepherd; I shall not want."),
    ("perl", "Perl is a highly capable, feature-rich programming language"),
]
SAMPLE_PROMPTS = [
    "And it came to pass, when the king",
    "To open a file for reading in Python, use",
    "static int\nparse_number (const char *s, long *out)\n{\n",
    "The fortune cookie said:",
    "SYNOPSIS\n       #include <string.h>\n\n",
]
T0 = time.time()


def log(*a):
    print("[%7.1fs]" % (time.time() - T0), *a, flush=True)


# ----------------------------------------------------------------------------- MXFP4
FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP4_MID = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def mxfp4_round(w):
    """Round w (any shape, last dim % 32 == 0) to MXFP4 along the last dim; returns w's dtype.
    Block scale 2^e with e = ceil(log2(amax/6)) (no clipping); nearest E2M1 magnitude."""
    x = (w.double() if w.dtype == torch.float64 else w.float()).reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = x.abs().amax(-1, keepdim=True)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(min=-126, max=127)
    scale = torch.exp2(e)
    y = x / scale
    idx = torch.bucketize(y.abs(), FP4_MID.to(device=w.device, dtype=x.dtype))
    q = FP4_GRID.to(device=w.device, dtype=x.dtype)[idx] * torch.sign(y)
    return (q * scale).reshape(w.shape).to(w.dtype)


def mxfp4_round_param(w, transposed):
    """mxfp4_round of a fused expert parameter whose input dim is the last one, or dim -2 if transposed."""
    if transposed:
        return mxfp4_round(w.transpose(-1, -2)).transpose(-1, -2)
    return mxfp4_round(w)


def experts_transposed(model):
    """True when transformers stores fused experts as [E, in, out] (down_proj [E, I, H]), False for
    [E, out, in] (down_proj [E, H, I]); decided from down_proj's shape (needs H != I)."""
    H, I = model.config.hidden_size, model.config.moe_intermediate_size
    assert H != I, "hidden_size must differ from moe_intermediate_size to tell the expert layout"
    ex = moe_layers(model)[0][1].experts
    d, gu = tuple(ex.down_proj.shape), tuple(ex.gate_up_proj.shape)
    if d[1:] == (H, I):
        tr = False
    elif d[1:] == (I, H):
        tr = True
    else:
        raise RuntimeError("unexpected down_proj shape %s" % (d,))
    log("experts module %s: gate_up_proj %s down_proj %s is_transposed=%r -> input dim %s" % (
        type(ex).__name__, gu, d, getattr(ex, "is_transposed", None), "-2" if tr else "-1"))
    return tr


def mxfp4_encode(w):
    """Exact MXFP4 encoding of a 2-D tensor [out, in] whose values are already MXFP4-representable.
    Returns (packed U8 [out, in/2] low nibble = even element, scale U8 E8M0 [out, in/32]).
    Raises if any value is not exactly representable (the export must be lossless)."""
    out_f, in_f = w.shape
    x = w.double().reshape(out_f, in_f // 32, 32)
    amax = x.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.full_like(amax, -127.0))
    e = e.clamp(min=-127, max=127)
    y = x / torch.exp2(e)
    idx = torch.bucketize(y.abs(), FP4_MID.double().to(w.device))
    back = FP4_GRID.double().to(w.device)[idx] * torch.sign(y)
    if not torch.equal(back, y):
        bad = (back != y)
        r, b = [int(v) for v in torch.nonzero(bad.any(-1))[0]]
        raise RuntimeError("mxfp4_encode: %d values not exactly MXFP4-representable; e.g. row %d block %d: "
                           "e=%d values %s" % (int(bad.sum()), r, b, int(e[r, b, 0]), x[r, b].tolist()))
    code = idx.to(torch.uint8) | ((y < 0).to(torch.uint8) << 3)
    code = code.reshape(out_f, in_f)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    scale = (e.reshape(out_f, in_f // 32) + 127).to(torch.uint8)
    return packed.contiguous(), scale.contiguous()


def mxfp4_decode(packed, scale):
    """Inverse of mxfp4_encode: float32 [out, in]."""
    lut = torch.cat([FP4_GRID, -FP4_GRID]).to(packed.device)
    lo = (packed & 0xF).long()
    hi = (packed >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], packed.shape[1] * 2)
    vals = lut[codes]
    s = torch.exp2(scale.float() - 127.0).repeat_interleave(32, dim=1)
    return vals * s


# ----------------------------------------------------------------------------- data
def read_docs(path, max_bytes=0):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        text = f.read()
    docs = text.split(SEP)
    if max_bytes:
        out, n = [], 0
        for d in docs:
            out.append(d)
            n += len(d)
            if n >= max_bytes:
                break
        docs = out
    return docs


def train_tokenizer(docs, vocab, sample_bytes, out_dir, template_path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    sample, n = [], 0
    for d in docs:
        sample.append(d)
        n += len(d)
        if n >= sample_bytes:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - len(SPECIALS), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    assert tok.get_vocab_size() == vocab - len(SPECIALS), tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size() == vocab
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(template_path, encoding="utf-8") as f:
        template = f.read()
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "added_tokens_decoder": {str(tok.token_to_id(s)): {"content": s, "special": True, "lstrip": False,
                                                           "rstrip": False, "normalized": False,
                                                           "single_word": False} for s in SPECIALS},
        "chat_template": template,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]"}, f,
                  indent=2)
    return tok


def tokenize_stream(tok, docs, bos, eos):
    encs = tok.encode_batch(docs, add_special_tokens=False)
    total = sum(len(e.ids) + 2 for e in encs)
    arr = np.empty(total, dtype=np.uint16)
    p = 0
    for e in encs:
        arr[p] = bos
        arr[p + 1:p + 1 + len(e.ids)] = e.ids
        arr[p + 1 + len(e.ids)] = eos
        p += len(e.ids) + 2
    return arr


# ----------------------------------------------------------------------------- model
def make_config(vocab, ids, **kw):
    from transformers import DeepseekV3Config
    rp = dict(rope_type="yarn", rope_theta=50000.0, factor=32.0, original_max_position_embeddings=4096,
              beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    common = dict(vocab_size=vocab, max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  hidden_act="silu", attention_bias=False, attention_dropout=0.0, topk_method="noaux_tc",
                  scoring_func="sigmoid", bos_token_id=ids["[BOS]"], eos_token_id=ids["[EOS]"],
                  pad_token_id=ids["[PAD]"])
    common.update(kw)
    cfg = DeepseekV3Config(rope_parameters=dict(rp), **common)
    got = getattr(cfg, "rope_parameters", None) or {}
    if got.get("rope_type") != "yarn" or float(got.get("rope_theta", 0)) != 50000.0:
        sc = {k: v for k, v in rp.items() if k != "rope_theta"}
        cfg = DeepseekV3Config(rope_theta=50000.0, rope_scaling=sc, **common)
        got = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    assert got.get("rope_type") == "yarn" and float(got.get("factor")) == 32.0, got
    return cfg


def main_config(vocab, ids, a):
    return make_config(vocab, ids, hidden_size=a.hidden, intermediate_size=a.dense_inter,
                       moe_intermediate_size=a.moe_inter, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                       num_key_value_heads=a.heads, n_routed_experts=a.experts, num_experts_per_tok=8,
                       n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.827,
                       norm_topk_prob=True, first_k_dense_replace=1, q_lora_rank=a.q_lora, kv_lora_rank=a.kv_lora,
                       qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, initializer_range=0.02)


def draft_config(vocab, ids, a):
    return make_config(vocab, ids, hidden_size=a.draft_hidden, intermediate_size=a.draft_hidden * 4,
                       moe_intermediate_size=64, num_hidden_layers=a.draft_layers, num_attention_heads=4,
                       num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                       n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
                       first_k_dense_replace=a.draft_layers, q_lora_rank=64, kv_lora_rank=32,
                       qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, initializer_range=0.02)


def set_experts_impl(model, impl):
    try:
        model.set_experts_implementation(impl)
    except Exception as e:  # older API
        log("set_experts_implementation(%s) failed: %r; trying config" % (impl, e))
        model.config._experts_implementation = impl


def moe_layers(model):
    return [(i, l.mlp) for i, l in enumerate(model.model.layers) if hasattr(l.mlp, "gate")]


class Trainer:
    """bf16 model + fp32 masters (AdamW). Routers stay fp32. qat: experts = mxfp4_round(master)."""

    def __init__(self, model, lr, wd, transposed=False):
        self.model = model
        self.transposed = transposed
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.masters = [p.detach().float().clone() for p in self.params]
        names = {id(p): n for n, p in model.named_parameters()}
        self.names = [names[id(p)] for p in self.params]
        self.is_expert = [bool(re.search(r"mlp\.experts\.(gate_up_proj|down_proj)$", n)) for n in self.names]
        decay = [m for m, p in zip(self.masters, self.params) if p.dim() >= 2]
        nodecay = [m for m, p in zip(self.masters, self.params) if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": nodecay, "weight_decay": 0.0}],
                                     lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
        self.qat = False

    def step(self, lr, clip=1.0):
        for m, p in zip(self.masters, self.params):
            m.grad = p.grad.float() if p.grad is not None else torch.zeros_like(m)
            p.grad = None
        gn = torch.nn.utils.clip_grad_norm_(self.masters, clip)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for m, p, ex in zip(self.masters, self.params, self.is_expert):
                p.copy_(mxfp4_round_param(m, self.transposed) if (ex and self.qat) else m)
        return gn


def count_hooks(model, counts):
    hs = []
    for i, moe in moe_layers(model):
        def hook(mod, args, kwargs, i=i):
            idx = args[1] if len(args) > 1 else kwargs.get("top_k_index", kwargs.get("topk_indices"))
            counts[i] += torch.bincount(idx.reshape(-1), minlength=counts[i].numel())
            # routers run in fp32: hand the experts weights in the activations' dtype (bf16 training only)
            if len(args) > 2 and args[2].dtype != args[0].dtype:
                return (args[0], args[1], args[2].to(args[0].dtype)) + tuple(args[3:]), kwargs
            return None
        hs.append(moe.experts.register_forward_pre_hook(hook, with_kwargs=True))
        # router weights are fp32 masters; feed them fp32 activations whatever the router does itself
        hs.append(moe.gate.register_forward_pre_hook(lambda m, args: (args[0].float(),) + tuple(args[1:])))
    return hs


def lr_at(step, total, peak, warm):
    if step < warm:
        return peak * (step + 1) / warm
    p = min(1.0, (step - warm) / max(1, total - warm))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


# ----------------------------------------------------------------------------- export
QUANT_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "mxfp4-pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "format": "mxfp4-pack-quantized", "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 32, "strategy": "group",
                    "dynamic": False, "actorder": None, "observer": "minmax", "scale_dtype": "torch.uint8",
                    "zp_dtype": None},
        "input_activations": None, "output_activations": None}},
    "ignore": ["lm_head", "re:.*embed_tokens.*", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.gate$",
               "re:.*mlp\\.(gate|up|down)_proj$"],
    "kv_cache_scheme": None,
}
EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


def load_dir_tensors(d):
    from safetensors.torch import load_file
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, fn)))
    return out


def write_shards(tensors, out_dir, shard_bytes, prefix="model"):
    """Write tensors into shards below shard_bytes each (tmp + rename) and the index; returns file list."""
    from safetensors.torch import save_file
    names = sorted(tensors)
    groups, cur, n = [], [], 0
    for k in names:
        b = tensors[k].numel() * tensors[k].element_size()
        if cur and n + b > shard_bytes:
            groups.append(cur)
            cur, n = [], 0
        cur.append(k)
        n += b
    groups.append(cur)
    files, wmap, total = [], {}, 0
    for gi, g in enumerate(groups):
        fn = "%s-%05d-of-%05d.safetensors" % (prefix, gi + 1, len(groups))
        path = os.path.join(out_dir, fn)
        save_file({k: tensors[k].contiguous() for k in g}, path + ".tmp", metadata={"format": "pt"})
        os.replace(path + ".tmp", path)
        files.append(fn)
        for k in g:
            wmap[k] = fn
            total += tensors[k].numel() * tensors[k].element_size()
    with open(os.path.join(out_dir, "%s.safetensors.index.json" % prefix), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2, sort_keys=True)
    return files


def export_main(model, out_dir, tmp_dir, shard_mb):
    """save_pretrained (per-expert bf16) -> re-encode experts MXFP4 -> shards; verify lossless."""
    hf = os.path.join(tmp_dir, "hf_bf16")
    model.save_pretrained(hf)
    src = load_dir_tensors(hf)
    # transformers 5.x should write per-expert tensors; split fused ones if it did not
    for k in [k for k in src if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj")]:
        t = src.pop(k)
        pre = k[:-len("gate_up_proj")] if k.endswith("gate_up_proj") else k[:-len("down_proj")]
        log("export: splitting fused %s %s" % (k, tuple(t.shape)))
        if experts_transposed(model):
            t = t.transpose(-1, -2)
        for e in range(t.shape[0]):
            if k.endswith("gate_up_proj"):
                half = t.shape[1] // 2
                src["%s%d.gate_proj.weight" % (pre, e)] = t[e, :half].contiguous()
                src["%s%d.up_proj.weight" % (pre, e)] = t[e, half:].contiguous()
            else:
                src["%s%d.down_proj.weight" % (pre, e)] = t[e].contiguous()
    # Take the routed experts from the fused parameters themselves ([E, 2I, H] gate rows first, [E, H, I]),
    # exactly the trained MXFP4 values; report any difference from what save_pretrained wrote.
    I = model.config.moe_intermediate_size
    assert not experts_transposed(model)
    mism = 0
    for li, moe in moe_layers(model):
        gu = moe.experts.gate_up_proj.detach().cpu()
        dn = moe.experts.down_proj.detach().cpu()
        for e in range(gu.shape[0]):
            for nm, ten in (("gate_proj", gu[e, :I]), ("up_proj", gu[e, I:]), ("down_proj", dn[e])):
                k = "model.layers.%d.mlp.experts.%d.%s.weight" % (li, e, nm)
                if k in src and not torch.equal(src[k], ten):
                    if mism < 3:
                        d = (src[k].float() - ten.float()).abs()
                        pos = torch.nonzero(d)[:4].tolist()
                        log("save_pretrained differs for %s: %s %s vs %s, %d values differ at e.g. %s: saved %s "
                            "param %s" % (k, tuple(src[k].shape), src[k].dtype, ten.dtype, int((d > 0).sum()), pos,
                                          [float(src[k][i, j]) for i, j in pos], [float(ten[i, j]) for i, j in pos]))
                    mism += 1
                src[k] = ten.contiguous()
    log("export: %d expert tensors differ between save_pretrained and the fused parameters" % mism)
    outt, n_exp = {}, 0
    for k, t in src.items():
        if EXPERT_RE.match(k):
            try:
                packed, scale = mxfp4_encode(t.cpu())
            except RuntimeError as e:
                raise RuntimeError("%s %s: %s" % (k, tuple(t.shape), e))
            base = k[:-len(".weight")]
            outt[base + ".weight_packed"] = packed.cpu()
            outt[base + ".weight_scale"] = scale.cpu()
            n_exp += 1
        elif k.endswith("mlp.gate.e_score_correction_bias"):
            outt[k] = t.float()
        else:
            outt[k] = t.to(torch.bfloat16)
    want = 3 * model.config.n_routed_experts * (model.config.num_hidden_layers - model.config.first_k_dense_replace)
    if n_exp != want:
        raise RuntimeError("export: %d expert linears, expected %d; keys: %s" % (n_exp, want, sorted(src)[:20]))
    files = write_shards(outt, out_dir, shard_mb * 1000 * 1000)
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = QUANT_CONFIG
    cfg["architectures"] = ["DeepseekV3ForCausalLM"]
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    if os.path.exists(os.path.join(hf, "generation_config.json")):
        shutil.copy(os.path.join(hf, "generation_config.json"), out_dir)
    # verify: reload written files, dequantize, compare with the bf16 tensors bit for bit
    back = load_dir_tensors(out_dir)
    for k, t in src.items():
        m = EXPERT_RE.match(k)
        if m:
            base = k[:-len(".weight")]
            deq = mxfp4_decode(back[base + ".weight_packed"], back[base + ".weight_scale"])
            if not torch.equal(deq, t.float()):
                raise RuntimeError("export not lossless for %s" % k)
        elif k.endswith("e_score_correction_bias"):
            assert torch.equal(back[k], t.float()), k
        else:
            assert torch.equal(back[k].float(), t.to(torch.bfloat16).float()), k
    log("export: %d tensors (%d experts linears MXFP4) in %s; lossless verified" % (len(outt), n_exp, files))
    return files, cfg


def dequantized_dir(out_dir, tmp_dir):
    """A plain fp32 HF checkpoint of exactly what the exported files describe (for the float64 reference)."""
    from safetensors.torch import save_file
    d = os.path.join(tmp_dir, "hf_deq")
    os.makedirs(d, exist_ok=True)
    back = load_dir_tensors(out_dir)
    plain = {}
    for k, t in back.items():
        if k.endswith(".weight_packed"):
            base = k[:-len(".weight_packed")]
            plain[base + ".weight"] = mxfp4_decode(t, back[base + ".weight_scale"])
        elif k.endswith(".weight_scale"):
            continue
        else:
            plain[k] = t.float()
    save_file(plain, os.path.join(d, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def load_reference(d, dtype=torch.float64):
    from transformers import DeepseekV3ForCausalLM
    model, info = DeepseekV3ForCausalLM.from_pretrained(d, dtype=dtype, output_loading_info=True,
                                                        attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise RuntimeError("reference load mismatch: %s" % bad)
    set_experts_impl(model, "eager")
    return model.to("cuda").eval()


# ----------------------------------------------------------------------------- eval
@torch.no_grad()
def eval_heldout(model, stream, seq, bs, counts=None):
    n = (len(stream) - 1) // seq
    tot, cnt = 0.0, 0
    for b0 in range(0, n, bs):
        rows = [stream[i * seq:i * seq + seq + 1].astype(np.int64) for i in range(b0, min(n, b0 + bs))]
        x = torch.from_numpy(np.stack(rows)).cuda()
        logits = model(input_ids=x[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        tot += loss.item()
        cnt += x[:, 1:].numel()
    return tot / cnt, cnt


@torch.no_grad()
def greedy_golden(model, ids, n_new):
    """Cache-free greedy decode: logits of every prompt position, n_new greedy ids, top-2 margins."""
    x = torch.tensor([ids], device="cuda")
    out = model(input_ids=x).logits[0].double().cpu()
    prompt_logits = out
    gen, margins = [], []
    cur = list(ids)
    last = out[-1]
    for _ in range(n_new):
        top2 = torch.topk(last, 2)
        nxt = int(top2.indices[0])
        gen.append(nxt)
        margins.append(float(top2.values[0] - top2.values[1]))
        cur.append(nxt)
        last = model(input_ids=torch.tensor([cur], device="cuda")).logits[0, -1].double().cpu()
    return prompt_logits, gen, margins


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=".trainpack")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--max-train-bytes", type=int, default=0)
    ap.add_argument("--tok-sample-bytes", type=int, default=40_000_000)
    ap.add_argument("--tokenizer-dir", default="", help="reuse tokenizer.json/tokenizer_config.json from here")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dense-inter", type=int, default=768)
    ap.add_argument("--moe-inter", type=int, default=128)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--q-lora", type=int, default=128)
    ap.add_argument("--kv-lora", type=int, default=64)
    ap.add_argument("--draft-hidden", type=int, default=128)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--no-draft", action="store_true")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--train-seconds", type=float, default=360.0)
    ap.add_argument("--qat-frac", type=float, default=0.18)
    ap.add_argument("--bias-u", type=float, default=1e-3)
    ap.add_argument("--shard-mb", type=float, default=14.0)
    ap.add_argument("--golden-new", type=int, default=32)
    ap.add_argument("--template", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "kimi-k2-chat-template.jinja"))
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    np_rng = np.random.default_rng(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    out = a.out
    model_dir = os.path.join(out, "kimi-mini")
    draft_dir = os.path.join(out, "kimi-mini-draft")
    gold_dir = os.path.join(out, "golden_model")
    tmp_dir = os.path.join(out, "_tmp")
    for d in (model_dir, draft_dir, gold_dir, tmp_dir):
        os.makedirs(d, exist_ok=True)
    import transformers
    import tokenizers
    log("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__,
        "gpu", torch.cuda.get_device_name(0))
    metrics = {"args": vars(a), "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                             "tokenizers": tokenizers.__version__},
               "device": torch.cuda.get_device_name(0)}

    # 1-2. corpus and tokenizer
    train_docs = read_docs(os.path.join(a.data, "train.txt.xz"), a.max_train_bytes)
    held_docs = read_docs(os.path.join(a.data, "heldout.txt.xz"), a.max_train_bytes // 50 if a.max_train_bytes else 0)
    log("docs: train %d (%d chars) heldout %d (%d chars)" % (len(train_docs), sum(map(len, train_docs)),
                                                           len(held_docs), sum(map(len, held_docs))))
    if a.tokenizer_dir:
        from tokenizers import Tokenizer
        for fn in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(os.path.join(a.tokenizer_dir, fn), model_dir)
        tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    else:
        tok = train_tokenizer(train_docs, a.vocab, a.tok_sample_bytes, model_dir, a.template)
    for fn in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(model_dir, fn), draft_dir)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    log("tokenizer: vocab %d specials %s" % (tok.get_vocab_size(), ids))
    train_stream = tokenize_stream(tok, train_docs, ids["[BOS]"], ids["[EOS]"])
    held_stream = tokenize_stream(tok, held_docs, ids["[BOS]"], ids["[EOS]"])
    nbytes = sum(len(d.encode("utf-8")) for d in train_docs)
    log("tokens: train %d (%.2f bytes/token) heldout %d" % (len(train_stream), nbytes / len(train_stream),
                                                           len(held_stream)))
    metrics["corpus"] = {"train_docs": len(train_docs), "train_bytes": nbytes, "train_tokens": int(len(train_stream)),
                         "heldout_docs": len(held_docs), "heldout_tokens": int(len(held_stream))}
    del train_docs

    # 3. models
    from transformers import DeepseekV3ForCausalLM
    cfg = main_config(tok.get_vocab_size(), ids, a)
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    for _, moe in moe_layers(model):
        moe.gate.float()
    set_experts_impl(model, "grouped_mm")
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    n_exp = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    log("main model: %d params (%d routed-expert); config rope %s" % (n_params, n_exp,
                                                                      getattr(cfg, "rope_parameters", None)))
    metrics["params"] = {"total": n_params, "routed_experts": n_exp}
    tr = Trainer(model, a.lr, a.wd, experts_transposed(model))
    E = a.experts
    counts = {i: torch.zeros(E, dtype=torch.long, device="cuda") for i, _ in moe_layers(model)}
    hooks = count_hooks(model, counts)
    draft = None
    if not a.no_draft:
        dcfg = draft_config(tok.get_vocab_size(), ids, a)
        with torch.device("cuda"):
            draft = DeepseekV3ForCausalLM(dcfg)
        draft = draft.to(torch.bfloat16).train()
        dtr = Trainer(draft, a.draft_lr, a.wd)
        log("draft model: %d params" % sum(p.numel() for p in draft.parameters()))

    V = tok.get_vocab_size()
    seq, bs = a.seq, a.batch
    total = a.steps if a.steps else 10 ** 9
    qat_start = int(total * (1 - a.qat_frac)) if a.steps else 10 ** 9
    t_start = time.time()
    step = 0
    loss_hist = []
    while step < total:
        if step == qat_start and not tr.qat:
            tr.qat = True
            with torch.no_grad():
                for m, p, ex in zip(tr.masters, tr.params, tr.is_expert):
                    if ex:
                        p.copy_(mxfp4_round_param(m, tr.transposed))
            log("step %d: MXFP4 rounding of routed experts on (straight-through)" % step)
        offs = np_rng.integers(0, len(train_stream) - seq - 1, size=bs)
        x = torch.from_numpy(np.stack([train_stream[o:o + seq + 1].astype(np.int64) for o in offs])).cuda(
            non_blocking=True)
        lr = lr_at(step, total if a.steps else max(total, 1000), a.lr, a.warmup)
        logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        tr.step(lr)
        with torch.no_grad():   # loss-free balancing (DeepSeek-V3 sec. 2.1.2), outside the gradient
            for i, moe in moe_layers(model):
                load = counts[i].float()
                moe.gate.e_score_correction_bias.add_(a.bias_u * torch.sign(load.mean() - load))
                counts[i].zero_()
        if draft is not None:
            dl = draft(input_ids=x[:, :-1]).logits
            dloss = F.cross_entropy(dl.float().reshape(-1, V), x[:, 1:].reshape(-1))
            dloss.backward()
            dtr.step(lr_at(step, total if a.steps else max(total, 1000), a.draft_lr, a.warmup))
        step += 1
        if not a.steps and time.time() - t_start > 1.15 * a.train_seconds and step < total:
            log("step %d: over the time budget, stopping early (of %d)" % (step, total))
            total = step
        if step == 10:
            torch.cuda.synchronize()
            t10 = time.time()
        if step == total and step > 10:
            torch.cuda.synchronize()
            log("timing: %.1f ms/step over steps 10..%d (batch %d x %d)" % (
                (time.time() - t10) * 1000 / (step - 10), step, bs, seq))
        if step == 20 and not a.steps:
            torch.cuda.synchronize()
            t20 = time.time() - t_start
            # steps 0..19 include warm-up kernels; time 20 more steps for the rate
        if step == 40 and not a.steps:
            torch.cuda.synchronize()
            per = (time.time() - t_start - t20) / 20
            total = max(60, int(a.train_seconds / per))
            qat_start = int(total * (1 - a.qat_frac))
            log("timing: %.1f ms/step -> %d steps (QAT from %d) for %.0fs" % (per * 1000, total, qat_start,
                                                                           a.train_seconds))
        if step % 100 == 0 or step == total or step <= 3:
            l = loss.item()
            loss_hist.append((step, l))
            el = time.time() - t_start
            log("step %d/%d loss %.4f%s lr %.2e  %.0f tok/s" % (
                step, total, l, (" draft %.4f" % dloss.item()) if draft is not None else "", lr,
                step * bs * seq / el))
    torch.cuda.synchronize()
    train_time = time.time() - t_start
    log("trained %d steps, %d tokens, %.1fs" % (step, step * bs * seq, train_time))
    metrics["training"] = {"steps": step, "qat_start": qat_start, "batch": bs, "seq": seq,
                           "tokens": step * bs * seq, "seconds": train_time, "loss_curve": loss_hist}

    # final weights: experts exactly MXFP4, routers rounded to bf16 (as exported)
    with torch.no_grad():
        # The exported rounding is computed in float64 on the CPU (IEEE log2/exp2 exact on powers of two);
        # report how many values the GPU float32 rounding used during QAT differed from it.
        n_diff = n_tot = 0
        for m, p, ex in zip(tr.masters, tr.params, tr.is_expert):
            if ex:
                r64 = mxfp4_round_param(m.detach().double().cpu(), tr.transposed)
                r32 = mxfp4_round_param(m, tr.transposed).double().cpu()
                n_diff += int((r64 != r32).sum())
                n_tot += r64.numel()
                p.copy_(r64.to(p.dtype).to(p.device))
                assert torch.equal(p.data.double().cpu(), r64)
                assert torch.equal(mxfp4_round_param(p.data.double().cpu(), tr.transposed), r64)
        log("final MXFP4 rounding (float64, CPU): %d of %d values differ from the GPU float32 QAT rounding" % (
            n_diff, n_tot))
        for _, moe in moe_layers(model):
            moe.gate.weight.copy_(moe.gate.weight.to(torch.bfloat16).float())
    model.eval()

    # 4. export
    files, _ = export_main(model, model_dir, tmp_dir, a.shard_mb)
    for fn in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert os.path.exists(os.path.join(model_dir, fn))
    if draft is not None:
        draft.eval()
        from safetensors.torch import save_file
        hd = os.path.join(tmp_dir, "draft_hf")
        draft.save_pretrained(hd)
        dt = {k: v.to(torch.bfloat16) for k, v in load_dir_tensors(hd).items()}
        save_file(dt, os.path.join(draft_dir, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(hd, "config.json")) as f:
            dc = json.load(f)
        dc["architectures"] = ["DeepseekV3ForCausalLM"]
        with open(os.path.join(draft_dir, "config.json"), "w") as f:
            json.dump(dc, f, indent=2, sort_keys=True)

    # 5. eval on held-out (bf16, grouped_mm; same weights as exported)
    for i in counts:
        counts[i].zero_()
    hl, hn = eval_heldout(model, held_stream, seq, bs)
    usage = {}
    for i in sorted(counts):
        c = counts[i].double()
        p = c / c.sum()
        ent = float(-(p[p > 0] * p[p > 0].log()).sum())
        usage[i] = {"entropy_nats": ent, "entropy_frac_of_max": ent / math.log(E), "min": int(c.min()),
                    "max": int(c.max()), "unused": int((c == 0).sum()), "assignments": int(c.sum()),
                    "bias_min": float(model.model.layers[i].mlp.gate.e_score_correction_bias.min()),
                    "bias_max": float(model.model.layers[i].mlp.gate.e_score_correction_bias.max())}
        log("layer %d usage: entropy %.4f nats (%.4f of ln %d), min %d max %d unused %d" % (
            i, ent, ent / math.log(E), E, usage[i]["min"], usage[i]["max"], usage[i]["unused"]))
    for h in hooks:
        h.remove()
    uni = np.bincount(train_stream[1:], minlength=V).astype(np.float64) + 1.0
    uni /= uni.sum()
    tgt = held_stream[1:(len(held_stream) - 1) // seq * seq + 1]
    uni_loss = float(-np.log(uni[tgt]).mean())
    metrics["heldout"] = {"loss": hl, "ppl": math.exp(hl), "tokens": hn, "unigram_loss": uni_loss,
                          "unigram_ppl": math.exp(uni_loss), "bytes_per_token": nbytes / len(train_stream)}
    log("held-out: loss %.4f ppl %.2f | unigram loss %.4f ppl %.2f | %d tokens" % (
        hl, math.exp(hl), uni_loss, math.exp(uni_loss), hn))
    metrics["expert_usage"] = usage
    if draft is not None:
        dl_, _ = eval_heldout(draft, held_stream, seq, bs)
        metrics["draft_heldout"] = {"loss": dl_, "ppl": math.exp(dl_)}
        log("draft held-out: loss %.4f ppl %.2f" % (dl_, math.exp(dl_)))

    samples = []
    g = torch.Generator(device="cuda").manual_seed(a.seed)
    with torch.no_grad():
        for sp in SAMPLE_PROMPTS:
            cur = tok.encode(sp, add_special_tokens=False).ids
            for _ in range(80):
                lg = model(input_ids=torch.tensor([cur], device="cuda")).logits[0, -1].float()
                v, ix = torch.topk(lg / 0.8, 40)
                nxt = int(ix[torch.multinomial(torch.softmax(v, -1), 1, generator=g)])
                cur.append(nxt)
                if nxt == ids["[EOS]"]:
                    break
            samples.append({"prompt": sp, "text": tok.decode(cur[len(tok.encode(sp).ids):], skip_special_tokens=False)})
            log("SAMPLE %r -> %r" % (sp, samples[-1]["text"]))
    metrics["samples"] = samples

    # 6. goldens on the exported files, float64, eager experts. TF32 OFF: transformers runs the router matmul in
    # fp32 even in a float64 model, and TF32 there moves logits by ~2e-3 (measured).
    torch.backends.cuda.matmul.allow_tf32 = False
    bf16_model = model
    deq = dequantized_dir(model_dir, tmp_dir)
    ref = load_reference(deq)
    # the reloaded reference must hold exactly the trained weights
    sd_ref = ref.state_dict()
    n_cmp = 0
    for k, v in bf16_model.state_dict().items():
        if k not in sd_ref:
            raise RuntimeError("reference lacks %s" % k)
        if not torch.equal(sd_ref[k].cpu().float(), v.cpu().float()):
            raise RuntimeError("reference weight differs from trained weight: %s" % k)
        n_cmp += 1
    log("reference float64 model holds exactly the trained weights (%d tensors compared)" % n_cmp)
    golden_meta = []
    for name, prompt in GOLDEN_PROMPTS:
        pids = tok.encode(prompt, add_special_tokens=False).ids
        pl, gen, margins = greedy_golden(ref, pids, a.golden_new)
        with torch.no_grad():
            bl = bf16_model(input_ids=torch.tensor([pids], device="cuda")).logits[0].double().cpu()
        dev = float((bl - pl).abs().max())
        gj = {"prompt": prompt, "prompt_ids": pids,
              "prompt_logits": [[round(float(v), 5) for v in row] for row in pl],
              "greedy_ids": gen, "greedy_margins": [round(m, 6) for m in margins],
              "greedy_text": tok.decode(gen),
              "model": "models/kimi-mini", "reference": "transformers %s DeepseekV3ForCausalLM float64, experts "
              "eager, attention eager, on the exported (dequantized MXFP4) weights; cache-free greedy" %
              transformers.__version__,
              "prompt_logits_layout": "all prompt positions x full vocab, rounded to 1e-5",
              "min_margin": min(margins)}
        with open(os.path.join(gold_dir, name + ".json"), "w") as f:
            json.dump(gj, f)
        golden_meta.append({"name": name, "n_prompt": len(pids), "min_margin": min(margins),
                            "bf16_vs_f64_max_logit_diff": dev, "greedy_text": gj["greedy_text"]})
        log("GOLDEN %s: %d prompt ids, min margin %.4f, bf16-vs-f64 %.3f: %r" % (
            name, len(pids), min(margins), dev, gj["greedy_text"]))
    metrics["goldens"] = golden_meta
    if draft is not None:
        del ref
        torch.cuda.empty_cache()
        dref = load_reference(draft_dir)
        for name, prompt in GOLDEN_PROMPTS[:2]:
            pids = tok.encode(prompt, add_special_tokens=False).ids
            pl, gen, margins = greedy_golden(dref, pids, a.golden_new)
            top = torch.topk(pl, 20, dim=-1)
            gj = {"prompt": prompt, "prompt_ids": pids, "prompt_logits": [[round(float(v), 5) for v in pl[-1]]],
                  "prompt_top20": [[[int(i), round(float(v), 5)] for i, v in zip(ti, tv)]
                                   for ti, tv in zip(top.indices, top.values)],
                  "greedy_ids": gen, "greedy_margins": [round(m, 6) for m in margins],
                  "greedy_text": tok.decode(gen), "model": "models/kimi-mini-draft",
                  "reference": "transformers DeepseekV3ForCausalLM float64 eager on the bf16 draft weights",
                  "prompt_logits_layout": "last prompt position only (full vocab); prompt_top20 holds "
                  "[id, logit] of the 20 largest logits at every prompt position; rounded to 1e-5",
                  "min_margin": min(margins)}
            with open(os.path.join(gold_dir, "draft_" + name + ".json"), "w") as f:
                json.dump(gj, f)
            log("DRAFT GOLDEN %s min margin %.4f: %r" % (name, min(margins), gj["greedy_text"]))

    # chat template check through transformers (for the tokenizer teammates)
    try:
        from transformers import AutoTokenizer
        ht = AutoTokenizer.from_pretrained(model_dir)
        conv = [{"role": "user", "content": "What is a pointer in C?"},
                {"role": "assistant", "content": "A variable that holds an address."},
                {"role": "user", "content": "Thanks!"}]
        rendered = ht.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        cids = ht(rendered, add_special_tokens=False)["input_ids"]
        metrics["chat_check"] = {"messages": conv, "rendered": rendered, "ids": cids}
        log("chat render: %r -> %d ids" % (rendered, len(cids)))
    except Exception as e:
        log("chat template check failed: %r" % e)
        metrics["chat_check"] = {"error": repr(e)}

    metrics["total_seconds"] = time.time() - T0
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    shutil.rmtree(tmp_dir, ignore_errors=True)
    log("done")


if __name__ == "__main__":
    main()

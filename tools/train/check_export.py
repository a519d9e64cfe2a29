#!/usr/bin/env python3
"""Check the shipped default model and its goldens without torch (standard library only).

Usage: python3 tools/train/check_export.py [MODEL_DIR] [GOLDEN_DIR]
  (defaults: models/kimi-mini, tests/golden_model)
Checks: config.json (architecture, quantization_config mxfp4-pack-quantized, YaRN), the shard index
(every file exists, every tensor listed once, shards < 15 MB), tensor encodings (routed experts:
weight_packed U8 [out, in/2] + weight_scale U8 [out, in/32]; e_score_correction_bias F32; everything
else BF16), tokenizer files and specials, and the golden JSON files (fields, lengths, ids in vocab).
Exit status 0 when everything holds; otherwise prints each problem and exits 1.
"""
import json
import os
import re
import struct
import sys

EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.(weight_packed|weight_scale)$")


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > 100_000_000:
            raise ValueError("%s: header length %d is not sane" % (path, n))
        return json.loads(f.read(n))


def main():
    mdir = sys.argv[1] if len(sys.argv) > 1 else "models/kimi-mini"
    gdir = sys.argv[2] if len(sys.argv) > 2 else "tests/golden_model"
    errs = []
    cfg = json.load(open(os.path.join(mdir, "config.json")))
    H, I, E = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    L, K = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    q = cfg.get("quantization_config", {})
    if q.get("quant_method") != "compressed-tensors" or q.get("format") != "mxfp4-pack-quantized":
        errs.append("config.json: quantization_config is not compressed-tensors mxfp4-pack-quantized")
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rp.get("rope_type") != "yarn" or float(rp.get("factor", 0)) != 32.0:
        errs.append("config.json: rope parameters are not YaRN factor 32: %r" % rp)
    idx = json.load(open(os.path.join(mdir, "model.safetensors.index.json")))
    files = sorted(set(idx["weight_map"].values()))
    seen = {}
    for fn in files:
        p = os.path.join(mdir, fn)
        size = os.path.getsize(p)
        if size >= 15_000_000:
            errs.append("%s: %d bytes, shards must stay below 15 MB" % (fn, size))
        for k, v in header(p).items():
            if k == "__metadata__":
                continue
            seen[k] = v
            if idx["weight_map"].get(k) != fn:
                errs.append("%s: tensor %s not mapped to this file in the index" % (fn, k))
    if set(seen) != set(idx["weight_map"]):
        errs.append("index and shards list different tensors")
    n_exp = 0
    for k, v in seen.items():
        m = EXPERT.match(k)
        if m:
            n_exp += 1
            out_f, in_f = (H, I) if m.group(3) == "down" else (I, H)
            want = [out_f, in_f // 2] if m.group(4) == "weight_packed" else [out_f, in_f // 32]
            if v["dtype"] != "U8" or v["shape"] != want:
                errs.append("%s: %s %s, want U8 %s" % (k, v["dtype"], v["shape"], want))
        elif k.endswith("e_score_correction_bias"):
            if v["dtype"] != "F32" or v["shape"] != [E]:
                errs.append("%s: %s %s, want F32 [%d]" % (k, v["dtype"], v["shape"], E))
        elif v["dtype"] != "BF16":
            errs.append("%s: %s, want BF16" % (k, v["dtype"]))
    if n_exp != 2 * 3 * E * (L - K):
        errs.append("%d expert tensors, want %d" % (n_exp, 2 * 3 * E * (L - K)))
    tok = json.load(open(os.path.join(mdir, "tokenizer.json")))
    vocab = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    if vocab != cfg["vocab_size"]:
        errs.append("tokenizer has %d ids, config vocab_size %d" % (vocab, cfg["vocab_size"]))
    added = {t["content"] for t in tok["added_tokens"]}
    for s in ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>", "[BOS]", "[EOS]"):
        if s not in added:
            errs.append("tokenizer.json lacks special %s" % s)
    tc = json.load(open(os.path.join(mdir, "tokenizer_config.json")))
    if "<|im_assistant|>assistant<|im_middle|>" not in tc.get("chat_template", ""):
        errs.append("tokenizer_config.json: no Kimi chat template")
    n_gold = 0
    for fn in sorted(os.listdir(gdir)):
        if not fn.endswith(".json") or fn.startswith("draft_"):
            continue
        g = json.load(open(os.path.join(gdir, fn)))
        n_gold += 1
        for key in ("prompt", "prompt_ids", "prompt_logits", "greedy_ids", "greedy_margins"):
            if key not in g:
                errs.append("%s: missing %s" % (fn, key))
        if len(g["greedy_ids"]) != 32 or len(g["greedy_margins"]) != 32:
            errs.append("%s: want 32 greedy ids and margins" % fn)
        if len(g["prompt_logits"]) != len(g["prompt_ids"]):
            errs.append("%s: %d logit rows for %d prompt ids" % (fn, len(g["prompt_logits"]), len(g["prompt_ids"])))
        if any(len(r) != cfg["vocab_size"] for r in g["prompt_logits"]):
            errs.append("%s: logit rows must have vocab_size entries" % fn)
        if any(not (0 <= t < cfg["vocab_size"]) for t in g["prompt_ids"] + g["greedy_ids"]):
            errs.append("%s: id out of range" % fn)
    if n_gold < 5:
        errs.append("%d goldens in %s, want 5" % (n_gold, gdir))
    for e in errs:
        print("check_export:", e)
    print("check_export: %s (%d tensors in %d shards, %d goldens)" % ("FAIL" if errs else "ok", len(seen),
                                                                      len(files), n_gold))
    sys.exit(1 if errs else 0)


if __name__ == "__main__":
    main()

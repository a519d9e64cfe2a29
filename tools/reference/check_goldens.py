#!/usr/bin/env python3
"""Validates the reference golden cases under tests/golden/ without torch (standard library only).

  python3 tools/reference/check_goldens.py [GOLDEN_DIR]      (default: tests/golden next to this repo)

For every case directory (one holding golden.json):
  - golden.json: required fields and types; prompt_logits has one row of vocab_size finite floats per prompt id;
    20 greedy ids inside the vocab; greedy_ids[0] is the argmax of the last prompt row and greedy_margins[0] its
    top-2 margin; max_logit_abs matches the logits; margins are positive.
  - config.json: parses; the rope key is `rope_parameters` or `rope_scaling`; quantization_config (if any) is one
    of fp8 / compressed-tensors pack-quantized / mxfp4-pack-quantized.
  - safetensors: header bounds (8-byte length, JSON, offsets inside the file, sizes == numel * dtype size, no
    overlap or gap), the index's weight_map (when sharded) names each tensor in the file that holds it, and the
    tensor set equals the one the config describes in the stated encoding (names as published checkpoints).
    kimi_linear / kimi_k3 cases (make_goldens_kimi.py): the text config may sit in text_config; the tensor set is
    checked for its prefix (language_model. for kimi_k3), MXFP4 routed experts (U8 weight_packed/weight_scale) and
    the KDA tensors' F32 dtype, instead of the DeepSeek tensor list.
  - sizes: each case directory < 3 MB, all together < 24 MB.
Exit status 0 when everything holds, 1 otherwise (each problem printed with its file).
"""
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import canonical_shapes  # noqa: E402  (pure python part of the generator)

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
              "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
GOLDEN_KEYS = {"case": str, "description": str, "prompt_ids": list, "prompt_logits": list, "greedy_ids": list,
               "greedy_margins": list, "transformers_version": str, "torch_version": str, "max_logit_abs": float}
CASE_MAX = 3_000_000
TOTAL_MAX = 24_000_000
KIMI_TYPES = ("kimi_linear", "kimi_k3")


class Checker:
    def __init__(self):
        self.problems = []

    def fail(self, where, msg):
        self.problems.append("%s: %s" % (where, msg))

    def expect(self, cond, where, msg):
        if not cond:
            self.fail(where, msg)
        return cond


def read_safetensors_header(path, ck):
    """-> {name: (dtype, shape, begin, end)} with the absolute data offset base, or None on error."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            ck.fail(path, "shorter than 8 bytes")
            return None
        n = struct.unpack("<Q", raw)[0]
        if n == 0 or n > size - 8 or n > 100_000_000:
            ck.fail(path, "header length %d does not fit the file size %d" % (n, size))
            return None
        try:
            hdr = json.loads(f.read(n))
        except ValueError as ex:
            ck.fail(path, "header is not JSON: %s" % ex)
            return None
    data_len = size - 8 - n
    out = {}
    spans = []
    for name, d in hdr.items():
        if name == "__metadata__":
            continue
        dt, shape, (b, e) = d["dtype"], d["shape"], d["data_offsets"]
        if not ck.expect(dt in DTYPE_SIZE, path, "%s: unknown dtype %s" % (name, dt)):
            continue
        numel = math.prod(shape) if shape else 1
        ck.expect(0 <= b <= e <= data_len, path, "%s: offsets [%d,%d) outside data of %d bytes" % (name, b, e,
                                                                                               data_len))
        ck.expect(e - b == numel * DTYPE_SIZE[dt], path, "%s: %d bytes for %s %s" % (name, e - b, dt, shape))
        spans.append((b, e, name))
        out[name] = (dt, tuple(shape), 8 + n + b, 8 + n + e)
    spans.sort()
    pos = 0
    for b, e, name in spans:
        ck.expect(b == pos, path, "%s: data starts at %d, previous tensor ended at %d (gap or overlap)" % (name, b,
                                                                                                        pos))
        pos = e
    ck.expect(pos == data_len, path, "tensor data ends at %d but the file holds %d data bytes" % (pos, data_len))
    return out


def read_ints(path, entry):
    dt, shape, b, e = entry
    with open(path, "rb") as f:
        f.seek(b)
        raw = f.read(e - b)
    fmt = {"I64": "q", "I32": "i"}[dt]
    return list(struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw))


def expected_tensors(cfg):
    """{name: (dtype, shape)} the config promises, in its encoding."""
    qc = cfg.get("quantization_config") or {}
    kw = dict(cfg)
    kw.setdefault("q_lora_rank", None)
    out = {}
    for name, shape, kind in canonical_shapes(kw):
        base = name[:-len(".weight")] if name.endswith(".weight") else name
        if kind == "bias":
            out[name] = ("F32", shape)
        elif qc.get("quant_method") == "fp8" and kind in ("linear", "dense", "expert", "shared"):
            bo, bi = qc["weight_block_size"]
            out[name] = ("F8_E4M3", shape)
            out[name + "_scale_inv"] = ("F32", (math.ceil(shape[0] / bo), math.ceil(shape[1] / bi)))
        elif qc.get("format") == "pack-quantized" and kind == "expert":
            out[base + ".weight_packed"] = ("I32", (shape[0], shape[1] // 8))
            out[base + ".weight_scale"] = ("BF16", (shape[0], shape[1] // 32))
            out[base + ".weight_shape"] = ("I64", (2,))
        elif qc.get("format") == "mxfp4-pack-quantized" and kind == "expert":
            out[base + ".weight_packed"] = ("U8", (shape[0], shape[1] // 2))
            out[base + ".weight_scale"] = ("U8", (shape[0], shape[1] // 32))
        else:
            out[name] = ("BF16", shape)
    return out


def check_kimi_tensors(cdir, cfg, tcfg, tensors, ck):
    """Prefix, skipped vision tensors, MXFP4 experts and F32 KDA tensors of a kimi_linear / kimi_k3 case."""
    prefix = "language_model." if cfg.get("model_type") == "kimi_k3" else ""
    qc = tcfg.get("quantization_config") or {}
    mx = qc.get("format") == "mxfp4-pack-quantized"
    for k, v in tensors.items():
        dt = v[0]
        if k.startswith(("vision_tower.", "mm_projector.")):
            ck.expect(prefix != "", cdir, "vision tensor %s in a text-only case" % k)
            continue
        ck.expect(k.startswith(prefix + "model.") or k.startswith(prefix + "lm_head."), cdir,
                  "tensor %s outside the text prefix %r" % (k, prefix))
        if ".block_sparse_moe.experts." in k:
            want = ("weight_packed", "weight_scale") if mx else ("weight",)
            ck.expect(k.rsplit(".", 1)[1] in want, cdir, "routed expert tensor %s (want %s)" % (k, want))
            if mx:
                ck.expect(dt == "U8", cdir, "%s is %s, want U8" % (k, dt))
        if k.endswith(("A_log", "dt_bias")):
            ck.expect(dt == "F32", cdir, "%s is %s, want F32" % (k, dt))
    ck.expect(any(k.endswith("embed_tokens.weight") for k in tensors), cdir, "no embed_tokens")


def check_case(cdir, ck):
    gpath = os.path.join(cdir, "golden.json")
    cpath = os.path.join(cdir, "config.json")
    try:
        with open(gpath) as f:
            g = json.load(f)
        with open(cpath) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as ex:
        ck.fail(cdir, "cannot read golden.json/config.json: %s" % ex)
        return None
    for k, t in GOLDEN_KEYS.items():
        ck.expect(isinstance(g.get(k), t), gpath, "field %s missing or not %s" % (k, t.__name__))
    if ck.problems and any(p.startswith(gpath) for p in ck.problems):
        return None
    kimi = cfg.get("model_type") in KIMI_TYPES
    tcfg = cfg.get("text_config", cfg) if kimi else cfg
    V = tcfg["vocab_size"]
    ck.expect(g["case"] == os.path.basename(cdir.rstrip("/")), gpath, "case %r != directory name" % g["case"])
    ids = g["prompt_ids"]
    ck.expect(8 <= len(ids) <= 12 and all(isinstance(i, int) and 0 <= i < V for i in ids), gpath,
              "prompt_ids must be 8..12 ids in [0,%d)" % V)
    pl = g["prompt_logits"]
    ck.expect(len(pl) == len(ids), gpath, "prompt_logits has %d rows for %d prompt ids" % (len(pl), len(ids)))
    mx = 0.0
    for r, row in enumerate(pl):
        if not ck.expect(len(row) == V and all(isinstance(x, float) and math.isfinite(x) for x in row), gpath,
                         "prompt_logits row %d: %d values, want %d finite floats" % (r, len(row), V)):
            return None
        mx = max(mx, max(abs(x) for x in row))
    gi, gm = g["greedy_ids"], g["greedy_margins"]
    ck.expect(len(gi) == 20 and all(isinstance(i, int) and 0 <= i < V for i in gi), gpath, "greedy_ids: 20 ids")
    ck.expect(len(gm) == 20 and all(isinstance(x, float) and x > 0 for x in gm), gpath,
              "greedy_margins: 20 positive floats")
    last = pl[-1]
    order = sorted(range(V), key=lambda i: -last[i])
    ck.expect(gi[0] == order[0], gpath, "greedy_ids[0]=%d is not the argmax %d of the last prompt row" % (gi[0],
                                                                                                      order[0]))
    ck.expect(abs(gm[0] - (last[order[0]] - last[order[1]])) < 1e-12, gpath, "greedy_margins[0] != top-2 gap")
    ck.expect(abs(g["max_logit_abs"] - mx) < 1e-12, gpath, "max_logit_abs %r != %r" % (g["max_logit_abs"], mx))

    # config
    if not kimi:
        has_v5 = isinstance(cfg.get("rope_parameters"), dict)
        has_legacy = "rope_scaling" in cfg
        ck.expect(has_v5 != has_legacy, cpath, "exactly one of rope_parameters / rope_scaling expected")
        ck.expect(cfg.get("model_type") in ("deepseek_v3", "kimi_k2"), cpath, "model_type %r" % cfg.get("model_type"))
    else:
        ck.expect(isinstance(tcfg.get("linear_attn_config"), dict), cpath, "kimi case without linear_attn_config")
    qc = tcfg.get("quantization_config")
    if qc is not None:
        ok = qc.get("quant_method") == "fp8" or (qc.get("quant_method") == "compressed-tensors" and qc.get(
            "format") in ("pack-quantized", "mxfp4-pack-quantized"))
        ck.expect(ok, cpath, "unexpected quantization_config %r" % qc)

    # safetensors
    idx = os.path.join(cdir, "model.safetensors.index.json")
    tensors = {}
    where = {}
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        files = sorted(set(wm.values()))
        ck.expect(len(files) >= 2, idx, "sharded case with %d shard(s)" % len(files))
    else:
        wm, files = None, ["model.safetensors"]
    for fn in files:
        p = os.path.join(cdir, fn)
        if not ck.expect(os.path.exists(p), cdir, "missing %s" % fn):
            continue
        h = read_safetensors_header(p, ck) or {}
        for k, v in h.items():
            ck.expect(k not in tensors, p, "tensor %s also in %s" % (k, where.get(k)))
            tensors[k] = v
            where[k] = p
            if wm is not None:
                ck.expect(wm.get(k) == fn, idx, "weight_map[%s] = %r but it is in %s" % (k, wm.get(k), fn))
    if wm is not None:
        ck.expect(set(wm) == set(tensors), idx, "weight_map names %d tensors, shards hold %d" % (len(wm),
                                                                                               len(tensors)))
    if kimi:
        check_kimi_tensors(cdir, cfg, tcfg, tensors, ck)
        exp = {}
        tensors = {}
    else:
        exp = expected_tensors(cfg)
    for k in sorted(set(exp) - set(tensors)):
        ck.fail(cdir, "missing tensor %s" % k)
    for k in sorted(set(tensors) - set(exp)):
        ck.fail(cdir, "unexpected tensor %s" % k)
    for k in sorted(set(exp) & set(tensors)):
        dt, shape = exp[k]
        ck.expect((tensors[k][0], tensors[k][1]) == (dt, tuple(shape)), where[k],
                  "%s is %s %s, want %s %s" % (k, tensors[k][0], tensors[k][1], dt, tuple(shape)))
        if k.endswith(".weight_shape") and tensors[k][0] in ("I32", "I64"):
            base = k[:-len("_shape")]
            packed = tensors.get(base + "_packed")
            want = [packed[1][0], packed[1][1] * 8] if packed else None
            ck.expect(read_ints(where[k], tensors[k]) == want, where[k], "%s != %r" % (k, want))
    size = sum(os.path.getsize(os.path.join(cdir, f)) for f in os.listdir(cdir))
    ck.expect(size < CASE_MAX, cdir, "%d bytes (limit %d)" % (size, CASE_MAX))
    return g, size


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden")
    ck = Checker()
    cases = sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "golden.json")))
    if not cases:
        print("no golden cases under %s" % root)
        return 1
    total = 0
    print("%-20s %8s %9s %9s  %s" % ("case", "bytes", "min_marg", "maxlogit", "greedy_ids"))
    for c in cases:
        r = check_case(os.path.join(root, c), ck)
        if r:
            g, size = r
            total += size
            print("%-20s %8d %9.4f %9.3f  %s" % (c, size, min(g["greedy_margins"]), g["max_logit_abs"],
                                                  ",".join(map(str, g["greedy_ids"]))))
    total += sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root)
                 if os.path.isfile(os.path.join(root, f)))
    ck.expect(total < TOTAL_MAX, root, "all goldens take %d bytes (limit %d)" % (total, TOTAL_MAX))
    for p in ck.problems:
        print("PROBLEM " + p)
    print("%d cases, %d bytes, %d problems" % (len(cases), total, len(ck.problems)))
    return 1 if ck.problems else 0


if __name__ == "__main__":
    sys.exit(main())

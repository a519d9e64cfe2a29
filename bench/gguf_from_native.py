#!/usr/bin/env python3
"""Write a llama.cpp GGUF with the same weight shapes as a deltafin native model (DeepSeek-V3 / Kimi K2 family).

usage: gguf_from_native.py NATIVE_DIR OUT.gguf [--spine q8_0|f32] [--quiet]

For bench/compare_llamacpp.sh: the peer (llama.cpp, arch "deepseek2", MLA) runs the same shapes, bytes per token and
routing fan-out as deltafin. Values need not match between engines; what is written:
  - routed experts: MXFP4 (ggml type 39), the native model's own bytes re-laid out: one 17-byte block_mxfp4 per 32
    weights = 1 byte E8M0 scale + 16 bytes of nibbles. deltafin packs E2M1 nibbles low = even element (element 2k
    in the low nibble of byte k); ggml packs qs[j] low nibble = element j, high nibble = element j + 16. The E2M1
    codes and the E8M0 byte are the same in both (ggml's table holds 2x the E2M1 value and its scale is halved), so
    every weight dequantizes to the same value. Per layer: ffn_{gate,up,down}_exps, one 3-D tensor each.
  - spine 2-D linears (embedding, attention, dense MLP, shared expert, lm_head): Q8_0 (ggml type 8: 34-byte blocks
    of 32 = fp16 scale + 32 int8), quantized from the native bf16 / fp8_b128 / f32 / f16 values (lossy: llama.cpp's
    usual format, fine for speed); --spine f32 keeps them f32 (large). kv_b_proj is split into attn_k_b
    (transposed) and attn_v_b as llama.cpp's converter does.
  - router (ffn_gate_inp), its correction bias (exp_probs_b) and norms: F32.
  - no tokenizer: tokenizer.ggml.model = "no_vocab" with deepseek2.vocab_size (llama-bench feeds random ids).
File layout: GGUF v3 header, KV pairs, tensor table, data aligned to 32 bytes. Only numpy is needed.
"""
import json
import os
import struct
import sys
import time

import numpy as np

GGML_F32, GGML_Q8_0, GGML_MXFP4 = 0, 8, 39
ALIGN = 32
# GGUF metadata value types
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64 = 4, 5, 6, 7, 8, 9, 10

CHUNK = 1 << 22  # elements per conversion chunk (bounds memory)


def die(msg):
    sys.stderr.write("gguf_from_native: %s\n" % msg)
    sys.exit(1)


# ------------------------------------------------------------------ decoding native weights to f32

def _fp8_e4m3fn_table():
    t = np.zeros(256, np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = 0.0  # NaN in e4m3fn: never written by a quantizer; 0 keeps Q8_0 finite
        elif e == 0:
            v = (m / 8.0) * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


FP8_TABLE = _fp8_e4m3fn_table()


class Native:
    def __init__(self, d):
        self.dir = d
        with open(os.path.join(d, "manifest.json")) as f:
            self.m = json.load(f)
        if self.m.get("format") != "deltafin-native":
            die("%s: not a deltafin native model (manifest format %r)" % (d, self.m.get("format")))
        self.cfg = self.m["config"]
        self.spine_path = os.path.join(d, self.m["spine"]["file"])
        self.spine = np.memmap(self.spine_path, np.uint8, "r")
        self.tensors = {t["name"]: t for t in self.m["spine"]["tensors"]}

    def has(self, name):
        return name in self.tensors

    def info(self, name):
        if name not in self.tensors:
            die("spine tensor %s missing from %s" % (name, self.dir))
        return self.tensors[name]

    def rows_f32(self, name, r0, r1):
        """Rows [r0, r1) of a 1-D or 2-D spine tensor as float32 [r1-r0, cols]."""
        t = self.info(name)
        shape = t["shape"]
        cols = shape[-1] if len(shape) == 2 else shape[0]
        ty, off = t["type"], t["offset"]
        if ty in ("bf16", "f16"):
            a = np.frombuffer(self.spine, np.uint16, (r1 - r0) * cols, off + 2 * r0 * cols).reshape(r1 - r0, cols)
            if ty == "bf16":
                return (a.astype(np.uint32) << 16).view(np.float32)
            return a.view(np.float16).astype(np.float32)
        if ty == "f32":
            return np.frombuffer(self.spine, np.float32, (r1 - r0) * cols, off + 4 * r0 * cols).reshape(r1 - r0, cols).copy()
        if ty == "fp8_b128":
            q = np.frombuffer(self.spine, np.uint8, (r1 - r0) * cols, off + r0 * cols).reshape(r1 - r0, cols)
            rows = shape[0]
            sr, sc = (rows + 127) // 128, (cols + 127) // 128
            s = np.frombuffer(self.spine, np.float32, sr * sc, t["scale_offset"]).reshape(sr, sc)
            srow = s[np.arange(r0, r1) // 128]                     # [n, sc]
            scol = np.repeat(srow, 128, axis=1)[:, :cols]          # [n, cols]
            return FP8_TABLE[q] * scol
        die("spine tensor %s: type %s is not supported by this converter (bf16, f16, f32, fp8_b128)" % (name, ty))

    def full_f32(self, name):
        t = self.info(name)
        rows = t["shape"][0] if len(t["shape"]) == 2 else 1
        a = self.rows_f32(name, 0, rows)
        return a.reshape(t["shape"])


# ------------------------------------------------------------------ ggml encodings

def q8_0(x):
    """float32 [n, 32k] -> block_q8_0 bytes [n * k, 34]."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = amax / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.rint(b * inv[:, None]), -127, 127).astype(np.int8)
    out = np.empty((b.shape[0], 34), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out


def mxfp4_to_ggml(data, scale):
    """deltafin mxfp4 (data [rows, cols/2] low nibble = even element; scale [rows, cols/32] E8M0)
    -> ggml block_mxfp4 bytes [rows * cols/32, 17] (e, qs[16]: low nibble element j, high nibble element j+16)."""
    d = data.reshape(-1, 16)
    n = np.empty((d.shape[0], 32), np.uint8)
    n[:, 0::2] = d & 15
    n[:, 1::2] = d >> 4
    out = np.empty((d.shape[0], 17), np.uint8)
    out[:, 0] = scale.reshape(-1)
    out[:, 1:] = n[:, :16] | (n[:, 16:] << 4)
    return out


def _selfcheck_mxfp4():
    """Both layouts decode a random block to the same 32 values."""
    e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
    kvalues = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)  # ggml kvalues_mxfp4
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, (3, 64), dtype=np.uint8)      # 3 rows x 128 columns
    scale = rng.integers(118, 136, (3, 4), dtype=np.uint8)
    ours = np.empty((3, 128), np.float32)
    ours[:, 0::2] = e2m1[data & 15]
    ours[:, 1::2] = e2m1[data >> 4]
    ours *= np.repeat(np.ldexp(1.0, scale.astype(np.int32) - 127), 32, axis=1)
    g = mxfp4_to_ggml(data, scale)
    theirs = np.empty((g.shape[0], 32), np.float32)
    half = np.ldexp(1.0, g[:, 0].astype(np.int32) - 128)[:, None]   # GGML_E8M0_TO_FP32_HALF
    theirs[:, :16] = kvalues[g[:, 1:] & 15] * half
    theirs[:, 16:] = kvalues[g[:, 1:] >> 4] * half
    if not np.array_equal(ours.reshape(-1), theirs.reshape(-1)):
        die("internal error: MXFP4 re-layout self-check failed")


# ------------------------------------------------------------------ GGUF writer

class Tensor:
    def __init__(self, name, ggml_type, ne, nbytes, produce):
        self.name, self.type, self.ne, self.nbytes, self.produce = name, ggml_type, ne, nbytes, produce


def _s(b, s):
    e = s.encode()
    b += struct.pack("<Q", len(e)) + e


def write_gguf(path, kvs, tensors, quiet):
    hdr = bytearray(b"GGUF")
    hdr += struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, ty, val in kvs:
        _s(hdr, key)
        hdr += struct.pack("<I", ty)
        if ty == T_U32:
            hdr += struct.pack("<I", val)
        elif ty == T_F32:
            hdr += struct.pack("<f", val)
        elif ty == T_BOOL:
            hdr += struct.pack("<B", 1 if val else 0)
        elif ty == T_STR:
            _s(hdr, val)
        else:
            die("internal: KV type %d" % ty)
    off = 0
    for t in tensors:
        _s(hdr, t.name)
        hdr += struct.pack("<I", len(t.ne))
        for n in t.ne:
            hdr += struct.pack("<Q", n)
        hdr += struct.pack("<IQ", t.type, off)
        t.offset = off
        off += (t.nbytes + ALIGN - 1) // ALIGN * ALIGN
    hdr += b"\0" * ((-len(hdr)) % ALIGN)
    data_start = len(hdr)
    tmp = path + ".tmp"
    t0 = time.time()
    done = 0
    total = off
    with open(tmp, "wb") as f:
        f.write(hdr)
        for i, t in enumerate(tensors):
            pos = f.tell() - data_start
            if pos != t.offset:
                f.write(b"\0" * (t.offset - pos))
            n = 0
            for chunk in t.produce():
                f.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
                n += chunk.nbytes
            if n != t.nbytes:
                die("internal: tensor %s wrote %d bytes, expected %d" % (t.name, n, t.nbytes))
            done += t.nbytes
            if not quiet and (i % 8 == 7 or i == len(tensors) - 1):
                el = time.time() - t0
                sys.stderr.write("\r  %5.1f / %.1f GB written (%.0f s)" % (done / 1e9, total / 1e9, el))
                sys.stderr.flush()
        f.write(b"\0" * ((-(f.tell() - data_start)) % ALIGN))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if not quiet:
        sys.stderr.write("\n")
    return data_start + total


# ------------------------------------------------------------------ the model

def build(nat, spine_type):
    cfg = nat.cfg
    mt = cfg.get("model_type")
    if mt not in ("kimi_k2", "deepseek_v3"):
        die("model_type %r: only the DeepSeek-V3 / Kimi K2 family maps to llama.cpp's deepseek2" % mt)
    H = cfg["hidden_size"]
    L = cfg["num_hidden_layers"]
    n_head = cfg["num_attention_heads"]
    q_lora = cfg.get("q_lora_rank") or 0
    kv_lora = cfg["kv_lora_rank"]
    nope, rope, vdim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    dense = cfg.get("first_k_dense_replace", 1)
    E = cfg["n_routed_experts"]
    I = cfg["moe_intermediate_size"]
    V = cfg["vocab_size"]
    ex = nat.m["experts"]
    if ex["type"] != "mxfp4":
        die("experts are %s: this converter writes MXFP4 experts from MXFP4 native ones only "
            "(deltafin synth --encoding mxfp4)" % ex["type"])
    if ex.get("latent_dim"):
        die("latent MoE (Kimi K3) has no deepseek2 equivalent")
    parts = {p["name"]: p for p in ex["parts"]}
    stride = ex["stride"]

    def spine_linear(name, ggml_name, rows_cols=None):
        t = nat.info(name)
        rows, cols = t["shape"]
        if cols % 32:
            die("%s: %d columns is not a multiple of 32 (Q8_0)" % (name, cols))
        step = max(1, CHUNK // cols)

        def produce():
            for r in range(0, rows, step):
                x = nat.rows_f32(name, r, min(rows, r + step))
                yield q8_0(x) if spine_type == "q8_0" else x

        nb = rows * cols // 32 * 34 if spine_type == "q8_0" else rows * cols * 4
        return Tensor(ggml_name, GGML_Q8_0 if spine_type == "q8_0" else GGML_F32, [cols, rows], nb, produce)

    def spine_f32(name, ggml_name):
        t = nat.info(name)
        shape = t["shape"]
        n = 1
        for s in shape:
            n *= s

        def produce():
            yield nat.full_f32(name).astype(np.float32).reshape(-1)

        return Tensor(ggml_name, GGML_F32, list(reversed(shape)), n * 4, produce)

    def kv_b_split(name, li):
        t = nat.info(name)
        rows, cols = t["shape"]
        if rows != n_head * (nope + vdim) or cols != kv_lora:
            die("%s: shape %s, expected [%d, %d]" % (name, t["shape"], n_head * (nope + vdim), kv_lora))
        cache = {}

        def whole():
            if "w" not in cache:
                cache["w"] = nat.rows_f32(name, 0, rows).reshape(n_head, nope + vdim, kv_lora)
            return cache["w"]

        def enc(x):
            return q8_0(x) if spine_type == "q8_0" else x.reshape(-1)

        def prod_k():  # attn_k_b ne (nope, kv_lora, n_head): per head k_b^T [kv_lora, nope]
            yield enc(np.ascontiguousarray(whole()[:, :nope, :].transpose(0, 2, 1)))

        def prod_v():  # attn_v_b ne (kv_lora, vdim, n_head)
            yield enc(np.ascontiguousarray(whole()[:, nope:, :]))
            cache.clear()

        def nb(n):
            return n // 32 * 34 if spine_type == "q8_0" else n * 4

        ty = GGML_Q8_0 if spine_type == "q8_0" else GGML_F32
        return [Tensor("blk.%d.attn_k_b.weight" % li, ty, [nope, kv_lora, n_head], nb(n_head * kv_lora * nope), prod_k),
                Tensor("blk.%d.attn_v_b.weight" % li, ty, [kv_lora, vdim, n_head], nb(n_head * vdim * kv_lora), prod_v)]

    packs = {}
    for lay in ex["layers"]:
        if len(lay["files"]) != 1:
            die("layer %d: experts striped over %d files; write the model with one expert directory"
                % (lay["layer"], len(lay["files"])))
        f = lay["files"][0]
        packs[lay["layer"]] = f if os.path.isabs(f) else os.path.join(nat.dir, f)

    def experts(li, part, ggml_name):
        p = parts[part]
        rows, cols = p["shape"]
        path = packs[li]

        def produce():
            mm = np.memmap(path, np.uint8, "r")
            try:
                for e in range(E):
                    base = e * stride
                    data = mm[base + p["offset"]: base + p["offset"] + p["bytes"]]
                    scale = mm[base + p["scale_offset"]: base + p["scale_offset"] + p["scale_bytes"]]
                    yield mxfp4_to_ggml(np.asarray(data), np.asarray(scale))
            finally:
                del mm

        return Tensor(ggml_name, GGML_MXFP4, [cols, rows, E], E * rows * cols // 32 * 17, produce)

    T = [spine_linear("model.embed_tokens.weight", "token_embd.weight")]
    for li in range(L):
        p = "model.layers.%d." % li
        b = "blk.%d." % li
        T.append(spine_f32(p + "input_layernorm.weight", b + "attn_norm.weight"))
        if q_lora:
            T.append(spine_linear(p + "self_attn.q_a_proj.weight", b + "attn_q_a.weight"))
            T.append(spine_f32(p + "self_attn.q_a_layernorm.weight", b + "attn_q_a_norm.weight"))
            T.append(spine_linear(p + "self_attn.q_b_proj.weight", b + "attn_q_b.weight"))
        else:
            T.append(spine_linear(p + "self_attn.q_proj.weight", b + "attn_q.weight"))
        T.append(spine_linear(p + "self_attn.kv_a_proj_with_mqa.weight", b + "attn_kv_a_mqa.weight"))
        T.append(spine_f32(p + "self_attn.kv_a_layernorm.weight", b + "attn_kv_a_norm.weight"))
        T.extend(kv_b_split(p + "self_attn.kv_b_proj.weight", li))
        T.append(spine_linear(p + "self_attn.o_proj.weight", b + "attn_output.weight"))
        T.append(spine_f32(p + "post_attention_layernorm.weight", b + "ffn_norm.weight"))
        if li < dense:
            T.append(spine_linear(p + "mlp.gate_proj.weight", b + "ffn_gate.weight"))
            T.append(spine_linear(p + "mlp.up_proj.weight", b + "ffn_up.weight"))
            T.append(spine_linear(p + "mlp.down_proj.weight", b + "ffn_down.weight"))
        else:
            T.append(spine_f32(p + "mlp.gate.weight", b + "ffn_gate_inp.weight"))
            if nat.has(p + "mlp.gate.e_score_correction_bias"):
                T.append(spine_f32(p + "mlp.gate.e_score_correction_bias", b + "exp_probs_b.bias"))
            T.append(experts(li, "gate", b + "ffn_gate_exps.weight"))
            T.append(experts(li, "up", b + "ffn_up_exps.weight"))
            T.append(experts(li, "down", b + "ffn_down_exps.weight"))
            if cfg.get("n_shared_experts", 0):
                T.append(spine_linear(p + "mlp.shared_experts.gate_proj.weight", b + "ffn_gate_shexp.weight"))
                T.append(spine_linear(p + "mlp.shared_experts.up_proj.weight", b + "ffn_up_shexp.weight"))
                T.append(spine_linear(p + "mlp.shared_experts.down_proj.weight", b + "ffn_down_shexp.weight"))
    T.append(spine_f32("model.norm.weight", "output_norm.weight"))
    if cfg.get("tie_word_embeddings"):
        pass  # llama.cpp falls back to token_embd
    else:
        T.append(spine_linear("lm_head.weight", "output.weight"))

    a = "deepseek2"
    kvs = [
        ("general.architecture", T_STR, a),
        ("general.name", T_STR, "%s (gguf_from_native)" % nat.m.get("name", "deltafin native")),
        ("general.alignment", T_U32, ALIGN),
        (a + ".vocab_size", T_U32, V),
        (a + ".context_length", T_U32, cfg.get("max_position_embeddings", 131072)),
        (a + ".embedding_length", T_U32, H),
        (a + ".block_count", T_U32, L),
        (a + ".feed_forward_length", T_U32, cfg.get("intermediate_size", 18432)),
        (a + ".attention.head_count", T_U32, n_head),
        (a + ".attention.head_count_kv", T_U32, 1),  # MLA as MQA (llama.cpp's converter)
        (a + ".rope.freq_base", T_F32, float(cfg.get("rope_theta", 10000))),
        (a + ".attention.layer_norm_rms_epsilon", T_F32, float(cfg.get("rms_norm_eps", 1e-6))),
        (a + ".expert_used_count", T_U32, cfg["num_experts_per_tok"]),
        (a + ".expert_count", T_U32, E),
        (a + ".leading_dense_block_count", T_U32, dense),
        (a + ".attention.kv_lora_rank", T_U32, kv_lora),
        (a + ".attention.key_length", T_U32, kv_lora + rope),
        (a + ".attention.value_length", T_U32, kv_lora),
        (a + ".attention.key_length_mla", T_U32, nope + rope),
        (a + ".attention.value_length_mla", T_U32, vdim),
        (a + ".expert_feed_forward_length", T_U32, I),
        (a + ".expert_shared_count", T_U32, cfg.get("n_shared_experts", 0)),
        (a + ".expert_weights_scale", T_F32, float(cfg.get("routed_scaling_factor", 1.0))),
        (a + ".expert_weights_norm", T_BOOL, bool(cfg.get("norm_topk_prob", True))),
        (a + ".expert_gating_func", T_U32, 2 if cfg.get("scoring_func", "sigmoid") == "sigmoid" else 1),
        (a + ".rope.dimension_count", T_U32, rope),
        ("tokenizer.ggml.model", T_STR, "no_vocab"),
    ]
    if q_lora:
        kvs.append((a + ".attention.q_lora_rank", T_U32, q_lora))
    if cfg.get("n_group", 1) > 1:
        kvs.append((a + ".expert_group_count", T_U32, cfg["n_group"]))
        kvs.append((a + ".expert_group_used_count", T_U32, cfg["topk_group"]))
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) == "yarn":
        kvs += [(a + ".rope.scaling.type", T_STR, "yarn"),
                (a + ".rope.scaling.factor", T_F32, float(rs.get("factor", 1.0))),
                (a + ".rope.scaling.original_context_length", T_U32,
                 int(rs.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 4096))))]
        if rs.get("mscale_all_dim") is not None:
            kvs.append((a + ".rope.scaling.yarn_log_multiplier", T_F32, 0.1 * float(rs["mscale_all_dim"])))
    return kvs, T


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    quiet = "--quiet" in argv
    spine_type = "q8_0"
    if "--spine" in argv:
        i = argv.index("--spine")
        if i + 1 >= len(argv) or argv[i + 1] not in ("q8_0", "f32"):
            die("--spine takes q8_0 or f32")
        spine_type = argv[i + 1]
        args = [a for a in args if a != argv[i + 1]]
    if len(args) != 2 or "-h" in argv or "--help" in argv:
        sys.stdout.write(__doc__)
        return 0 if ("-h" in argv or "--help" in argv) else 2
    _selfcheck_mxfp4()
    nat = Native(args[0])
    kvs, tensors = build(nat, spine_type)
    t0 = time.time()
    size = write_gguf(args[1], kvs, tensors, quiet)
    exp = sum(t.nbytes for t in tensors if t.type == GGML_MXFP4)
    print("gguf_from_native: wrote %s: %d tensors, %.3f GB (experts MXFP4 %.3f GB, spine %s %.3f GB) in %.0f s"
          % (args[1], len(tensors), size / 1e9, exp / 1e9, spine_type.upper(), (size - exp) / 1e9, time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""make_goldens.py — reference ids and chat strings for deltafin's tokenizer tests.

Runs on the GPU machine (tokenizers, tiktoken, transformers installed; no network).
Needs the npm-fetched files of tests/tokenizer/fetch.sh in CACHE (carried there).

  PYTHONUNBUFFERED=1 python3 tools/tokenizer/make_goldens.py CACHE OUTDIR [BENCH_BIN]

Writes to OUTDIR:
  golden_tok.jsonl    one line per tokenizer and corpus string: {"tok", "i", "ids"} plus "sp" (ids with special
                      tokens parsed) when different; big inputs: {"big", "n", "fnv", "head"}
                      (fnv = FNV-1a 64 of the ids as int32 little-endian)
  golden_chat.jsonl   {"fmt", "name", "messages", "tools", "gen", "thinking", "text", "how"}
  bench.txt           encode throughput of HF tokenizers / tiktoken on 10 MB of mixed text
Tokenizers: deepseek_v3, qwen3, gptoss (tokenizers.Tokenizer on tokenizer.json, add_special_tokens
False; "ids" with encode_special_tokens=True, "sp" with it False), o200k (tiktoken Encoding with the
o200k pattern and js-tiktoken's ranks: encode_ordinary / encode(allowed_special="all")), kimi_o200k
(same ranks, Kimi's pattern, 256 Kimi specials after the ranks, and Kimi's 400k/25k slicing).
"""
import base64, json, os, struct, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import corpus, big_inputs, mixed_text  # noqa: E402
import chat_cases  # noqa: E402

KIMI_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
KIMI_NAMED = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
              6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
              11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
              14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
              254: "[UNK]", 255: "[PAD]"}


def fnv(ids):
    h = 0xcbf29ce484222325
    for b in struct.pack("<%di" % len(ids), *ids):
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def kimi_slices(s):
    """tokenization_kimi.py / llama3: 400k-char chunks, runs of (non-)whitespace <= 25k chars."""
    for i in range(0, len(s), 400_000):
        sub = s[i:i + 400_000]
        cur_len = 0
        cur_space = sub[0].isspace() if sub else False
        start = 0
        for j in range(len(sub)):
            now = sub[j].isspace()
            if cur_space ^ now:
                cur_len = 1
                cur_space = now
            else:
                cur_len += 1
                if cur_len > 25_000:
                    yield sub[start:j]
                    start = j
                    cur_len = 1
        yield sub[start:]


def load_tokenizers(cache):
    from tokenizers import Tokenizer
    import tiktoken
    toks = {}
    for name in ("deepseek_v3", "qwen3", "gptoss"):
        a = Tokenizer.from_file(os.path.join(cache, name, "tokenizer.json"))
        b = Tokenizer.from_file(os.path.join(cache, name, "tokenizer.json"))
        assert hasattr(a, "encode_special_tokens"), "tokenizers too old: no encode_special_tokens"
        a.encode_special_tokens = True
        toks[name] = (lambda s, a=a: a.encode(s, add_special_tokens=False).ids,
                      lambda s, b=b: b.encode(s, add_special_tokens=False).ids)
    ranks = {}
    with open(os.path.join(cache, "o200k.tiktoken")) as f:
        for line in f:
            if line.strip():
                t, r = line.split()
                ranks[base64.b64decode(t)] = int(r)
    cfg = json.load(open(os.path.join(cache, "o200k_config.json")))
    sp = {v["content"]: int(k) for k, v in cfg["added_tokens_decoder"].items()}
    o = tiktoken.Encoding("o200k_test", pat_str=cfg["pat_str"], mergeable_ranks=ranks, special_tokens=sp)
    toks["o200k"] = (lambda s: o.encode_ordinary(s), lambda s: o.encode(s, allowed_special="all"))
    base = len(ranks)
    ksp = {KIMI_NAMED.get(k, "<|reserved_token_%d|>" % (base + k)): base + k for k in range(256)}
    k = tiktoken.Encoding("kimi_o200k", pat_str=KIMI_PAT, mergeable_ranks=ranks, special_tokens=ksp)

    def kimi_enc(s, special):
        out = []
        for sl in kimi_slices(s):
            out += k.encode(sl, allowed_special="all") if special else k.encode_ordinary(sl)
        return out
    toks["kimi_o200k"] = (lambda s: kimi_enc(s, False), lambda s: kimi_enc(s, True))
    return toks, o, a


def goldens(cache, out):
    toks, _, _ = load_tokenizers(cache)
    items = corpus()
    bigs = big_inputs()
    f = open(os.path.join(out, "golden_tok.jsonl"), "w")
    for name, (enc, enc_sp) in toks.items():
        t0 = time.time()
        if True:
            for i, (cat, v) in enumerate(items):
                s = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
                ids = enc(s)
                rec = {"tok": name, "i": i, "ids": ids}
                sp = enc_sp(s)
                if sp != ids:
                    rec["sp"] = sp
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            for bn, s in bigs.items():
                ids = enc(s)
                f.write(json.dumps({"tok": name, "big": bn, "n": len(ids), "fnv": fnv(ids), "head": ids[:32]},
                                   separators=(",", ":")) + "\n")
        print("goldens", name, "%.1fs" % (time.time() - t0), flush=True)
    f.close()


def render_hf(tok, tmpl, messages, tools, gen, thinking, fmt):
    kw = dict(tokenize=False, add_generation_prompt=gen)
    if tools:
        kw["tools"] = tools
    if tmpl is not None:
        kw["chat_template"] = tmpl
    if fmt == "qwen3":
        kw["enable_thinking"] = thinking
    return tok.apply_chat_template(messages, **kw)


def chat_goldens(cache, out):
    from transformers import AutoTokenizer
    # copy of shared/data/kimi-k2-chat-template.jinja (the template published with Kimi K2)
    kimi_tmpl = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "tokenizer",
                                  "kimi-k2-chat-template.jinja")).read()
    qwen = AutoTokenizer.from_pretrained(os.path.join(cache, "qwen3"))
    ds = AutoTokenizer.from_pretrained(os.path.join(cache, "deepseek_v3"))
    plans = {"kimi": (qwen, kimi_tmpl), "deepseek": (ds, None), "qwen3": (qwen, None), "harmony": (None, None)}
    f = open(os.path.join(out, "golden_chat.jsonl"), "w")
    for fmt, (tok, tmpl) in plans.items():
        n_ok = 0
        if True:
            for name, msgs, tools in chat_cases.cases(fmt):
                variants = [(True, False), (False, False)]
                if fmt in ("qwen3", "harmony"):
                    variants += [(True, True)]
                for gen, thinking in variants:
                    try:
                        if fmt == "harmony":
                            text, how = chat_cases.harmony(msgs, tools, gen, thinking), "chat_cases.harmony"
                        else:
                            text = render_hf(tok, tmpl, msgs, tools, gen, thinking, fmt)
                            how = "transformers apply_chat_template"
                    except Exception as e:  # a template that rejects the case: recorded, not a golden
                        print("chat", fmt, name, "skipped:", repr(e)[:200], flush=True)
                        continue
                    n_ok += 1
                    f.write(json.dumps({"fmt": fmt, "name": name, "messages": json.dumps(msgs, ensure_ascii=False),
                                        "tools": json.dumps(tools, ensure_ascii=False) if tools else None,
                                        "gen": gen, "thinking": thinking, "text": text, "how": how},
                                       ensure_ascii=False) + "\n")
        print("chat", fmt, n_ok, "goldens", flush=True)
    f.close()


def bench(cache, out, bench_bin):
    from tokenizers import Tokenizer
    text = mixed_text(10_000_000, 777, False)
    data = text.encode()
    with open("/tmp/bench10mb.txt", "wb") as f:
        f.write(data)
    lines = []
    lines.append("input: mixed_text(10_000_000, seed 777) = %d bytes, %d chars" % (len(data), len(text)))
    toks, o200k, _ = load_tokenizers(cache)
    for name in ("deepseek_v3", "qwen3", "gptoss"):
        t = Tokenizer.from_file(os.path.join(cache, name, "tokenizer.json"))
        t0 = time.perf_counter(); ids = t.encode(text, add_special_tokens=False).ids; best = time.perf_counter() - t0
        lines.append("hf-tokenizers %-12s encode(one 10MB str)  %7.3f s  %6.2f MB/s  %d ids" % (name, best, len(data) / best / 1e6, len(ids)))
        ls = text.split("\n")
        t0 = time.perf_counter(); r = t.encode_batch(ls, add_special_tokens=False); dt = time.perf_counter() - t0
        lines.append("hf-tokenizers %-12s encode_batch(lines, all cores) %7.3f s  %6.2f MB/s  %d ids" % (name, dt, len(data) / dt / 1e6, sum(len(x.ids) for x in r)))
        print(lines[-2], flush=True)
    best = 1e9
    for _ in range(2):
        t0 = time.perf_counter(); ids = o200k.encode_ordinary(text); best = min(best, time.perf_counter() - t0)
    lines.append("tiktoken      o200k        encode_ordinary          %7.3f s  %6.2f MB/s  %d ids" % (best, len(data) / best / 1e6, len(ids)))
    with open(os.path.join(out, "bench.txt"), "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    cache, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    what = os.environ.get("WHAT", "goldens,chat,bench").split(",")
    if "bench" in what:
        bench(cache, out, None)
    if "goldens" in what:
        goldens(cache, out)
    if "chat" in what:
        chat_goldens(cache, out)

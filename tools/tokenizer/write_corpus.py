#!/usr/bin/env python3
"""write_corpus.py — writes tests/tokenizer/corpus.jsonl from corpus.py: one line per string,
{"i", "cat", "b64": UTF-8 bytes (or the raw invalid bytes), "text": readable form}."""
import base64, json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import corpus  # noqa: E402

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "tokenizer", "corpus.jsonl")
with open(out + ".tmp", "w") as f:
    for i, (cat, v) in enumerate(corpus()):
        b = v if isinstance(v, bytes) else v.encode("utf-8")
        r = {"i": i, "cat": cat, "b64": base64.b64encode(b).decode()}
        r["text"] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
os.replace(out + ".tmp", out)

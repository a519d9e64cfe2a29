#!/usr/bin/env python3
"""jinja_diff.py — render tools/tokenizer/jinja_cases.py with jinja2 (transformers'
environment, hf_jinja.py) and with a deltafin driver (jinja_batch), print the
differences. Development aid; the committed goldens come from make_jinja_goldens.py.
  python3 tools/tokenizer/jinja_diff.py /tmp/jjb"""
import json, os, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_jinja, jinja_cases  # noqa: E402

os.environ.setdefault("DF_CHAT_NOW", "1767225600")
drv = sys.argv[1]
lines, want = [], []
for t in jinja_cases.CASES:
    try:
        want.append(("ok", hf_jinja.compile_template(t).render(**jinja_cases.V)))
    except Exception as e:
        want.append(("err", type(e).__name__ + ": " + str(e)))
    lines.append(json.dumps({"t": t, "v": json.dumps(jinja_cases.V)}))
out = subprocess.run([drv], input="\n".join(lines) + "\n", capture_output=True, text=True, env=os.environ).stdout.split("\n")
bad = 0
for t, w, g in zip(jinja_cases.CASES, want, out):
    g = json.loads(g)
    if w[0] == "ok" and g.get("ok") == w[1]:
        continue
    if w[0] == "err" and "err" in g:
        print("both fail:", repr(t)[:70], "| jinja2:", w[1][:90], "| deltafin:", g["err"][:110])
        continue
    bad += 1
    print("DIFF", repr(t))
    print("   jinja2:  ", repr(w[1])[:400])
    print("   deltafin:", repr(g.get("ok", g.get("err")))[:400])
print(len(jinja_cases.CASES), "cases,", bad, "differ")

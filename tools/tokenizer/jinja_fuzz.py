#!/usr/bin/env python3
"""jinja_fuzz.py — random differential testing of deltafin's Jinja subset
against jinja2 in transformers' environment (development aid).

  cc -g -fsanitize=address,undefined -Iinclude -Isrc tools/tokenizer/jinja_batch.c \\
     src/tokenizer/jinja_*.c -lutf8proc -lcjson -lm -o /tmp/jjb
  python3 tools/tokenizer/jinja_fuzz.py /tmp/jjb [N] [SEED]

Random expressions and statements over a fixed variable set; a case passes
when both render the same text or both raise. Prints the differing cases."""
import copy, json, os, random, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_jinja  # noqa: E402

V = {"s": "Hello, World", "e": "", "u": "ünï 世界 😀", "w": "  a b\tc \n", "i": 3, "z": 0, "m": -4, "f": 1.5,
     "g": -0.25, "t": True, "n": None, "l": [3, 1, 2], "ls": ["b", "A", "c"], "el": [], "d": {"k": "v", "n": 2},
     "ed": {}, "nl": [[1, "x"], [2, "y"]], "ds": [{"a": 1, "b": "x"}, {"a": 2}, {"a": 0, "b": "z"}]}
ATOMS = ["s", "e", "u", "w", "i", "z", "m", "f", "g", "t", "n", "l", "ls", "el", "d", "ed", "nl", "ds", "nope",
         "1", "0", "-2", "2.5", "1e3", "'x'", "'a,b'", "''", "none", "true", "false", "[1, 'q']", "{'a': 1}", "(1, 2)",
         "d.k", "d['n']", "l[0]", "l[-1]", "l[5]", "s[1:3]", "s[::-1]", "u[-2:]", "nl[1][1]", "ds[0].a", "d.missing"]
BIN = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "and", "or", "in", "not in"]
FILTERS = ["length", "upper", "lower", "trim", "first", "last", "list", "string", "tojson", "sort", "reverse",
           "unique|list", "join(',')", "default('D')", "int", "float", "abs", "title", "capitalize",
           "replace('l', 'L')", "items|list", "dictsort", "sum", "min", "max", "count", "wordcount", "round(1)",
           "map('string')|list", "select|list", "reject|list", "selectattr('a')|list", "map(attribute='a')|list",
           "tojson(indent=1)", "tojson(sort_keys=true)", "indent(2)", "center(9)", "truncate(5)", "e", "safe"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
         "odd", "even", "true", "false", "boolean", "lower", "upper", "in [1, 2, 3]", "eq 3", "divisibleby 2"]
METHODS = ["upper()", "lower()", "strip()", "split()", "split(',')", "startswith('H')", "endswith('d')",
           "replace('o', '0')", "title()", "find('o')", "count('l')", "get('k')", "get('q', 7)", "items()|list",
           "keys()|list", "values()|list", "rsplit(' ', 1)", "lstrip()", "rstrip()", "index(1)", "isdigit()"]


def expr(r, d=0):
    k = r.random()
    if d > 3 or k < 0.3:
        return r.choice(ATOMS)
    if k < 0.5:
        return "(%s %s %s)" % (expr(r, d + 1), r.choice(BIN), expr(r, d + 1))
    if k < 0.65:
        return "%s|%s" % (expr(r, d + 1), r.choice(FILTERS))
    if k < 0.75:
        return "(%s is %s%s)" % (expr(r, d + 1), r.choice(["", "not "]), r.choice(TESTS))
    if k < 0.85:
        return "%s.%s" % (r.choice(["s", "u", "w", "d", "l", "e", "'a b'"]), r.choice(METHODS))
    if k < 0.92:
        return "(%s if %s else %s)" % (expr(r, d + 1), expr(r, d + 1), expr(r, d + 1))
    return "(not %s)" % expr(r, d + 1)


def stmt(r, d=0):
    k = r.random()
    if d > 2 or k < 0.35:
        return "{{ %s }}" % expr(r)
    if k < 0.5:
        return "{%% if %s %%}%s{%% else %%}%s{%% endif %%}" % (expr(r), stmt(r, d + 1), stmt(r, d + 1))
    if k < 0.65:
        return "{%% for x in %s %%}[{{ x }}{{ loop.index }}]%s{%% else %%}E{%% endfor %%}" % (
            r.choice(["l", "ls", "s", "d", "el", "nl", "ds", "range(3)", "nope", "u"]), stmt(r, d + 1))
    if k < 0.75:
        return "{%% set q = %s %%}{{ q }}%s" % (expr(r), stmt(r, d + 1))
    if k < 0.85:
        return "{%% set ns = namespace(v=%s) %%}{%% for x in l %%}{%% set ns.v = ns.v ~ x %%}{%% endfor %%}{{ ns.v }}" % expr(r)
    ws = r.choice(["\n", "  \n", "\n  ", " ", ""])
    return "%s{%%- if %s -%%}%s{%%- endif %%}%s" % (ws, expr(r), stmt(r, d + 1), ws)


def main():
    drv = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    r = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    cases = [stmt(r) for _ in range(n)]
    vj = json.dumps(V)
    want = []
    for t in cases:
        try:
            want.append(("ok", hf_jinja.compile_template(t).render(**copy.deepcopy(V))))
        except Exception as e:
            want.append(("err", type(e).__name__ + ": " + str(e)))
    inp = "\n".join(json.dumps({"t": t, "v": vj}) for t in cases) + "\n"
    res = subprocess.run([drv], input=inp, capture_output=True, text=True)
    if res.returncode:
        print("driver crashed:", res.stderr[-3000:])
    out = res.stdout.split("\n")
    bad = 0
    for t, w, g in zip(cases, want, out):
        g = json.loads(g)
        if (w[0] == "ok" and g.get("ok") == w[1]) or (w[0] == "err" and "err" in g):
            continue
        if "err" in g and "not supported by deltafin" in g["err"]:
            continue  # a refusal, by design
        bad += 1
        if bad <= 25:
            print("DIFF", repr(t))
            print("   jinja2:  ", repr(w[1])[:300])
            print("   deltafin:", repr(g.get("ok", g.get("err")))[:300])
    print(len(cases), "random templates,", bad, "differ")


if __name__ == "__main__":
    main()

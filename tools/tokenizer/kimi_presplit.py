#!/usr/bin/env python3
"""kimi_presplit.py — expected Kimi pre-token splits and ids without tiktoken, from the Unicode
Character Database.

No Kimi tiktoken.model is available here and tiktoken cannot be run, so the expectation for CJK text
(issue 11 item 1: \\p{Han} is the Han *script*) is derived independently of any regex engine:

  * the eight alternatives of Kimi's split pattern (tokenization_kimi.py; tok_tiktoken.c
    tok_kimi_pattern) are implemented by hand below, with the leftmost-first / greedy / backtracking
    semantics of the Rust regex engine behind tiktoken, over character classes read from the UCD:
    General_Category (UnicodeData.txt), Script (Scripts.txt — Script, NOT Script_Extensions: the Rust
    regex crate reads a bare \\p{Han} as Script=Han), White_Space (PropList.txt, Rust's \\s);
  * each piece is BPE-encoded with tiktoken's merge rule (lowest-ranked adjacent pair first) over the
    o200k ranks (js-tiktoken's, tests/.cache/tok/o200k.tiktoken — the ranks the kimi_o200k goldens use).

Self-check (--check-goldens): the same code reproduces every kimi_o200k golden in
tests/tokenizer/golden_tok.jsonl (ids made by tiktoken 0.14.0 itself on the GPU machine), so the
hand-written pattern and BPE are the ones tiktoken runs. With the Python `regex` module installed, the
splits are also compared with `regex` running Kimi's pattern verbatim (V1 flag: `&&` intersection; bare
\\p{Han} = Script there too).

usage: kimi_presplit.py [--ucd DIR] [--ranks FILE] (--check-goldens | --write | TEXT...)
  --ucd DIR     UCD files (default /usr/share/unicode: Debian package unicode-data, Unicode 15.0)
  --ranks FILE  o200k rank file (default tests/.cache/tok/o200k.tiktoken; tests/tokenizer/fetch.sh makes it)
  --write       writes tests/tokenizer/kimi_cjk.jsonl for the CASES below
  TEXT...       prints the split and ids of each argument
"""
import base64, json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")

# CJK punctuation and script-extension cases (issue 11 item 1). Each note says what the case checks.
CASES = [
    ("完。\n\n", "U+3002 IDEOGRAPHIC FULL STOP: Script=Common (Script_Extensions has Han) -> not in [\\p{Han}]+"),
    ("東京タワー、大阪城。", "U+3001 / U+3002 after Han and katakana; U+30FC (Lm, Common) stays with the katakana"),
    ("Kimi说：「你好，世界！」——“引号”《书名》〈括弧〉【注】〔另〕…〆切は3日、OK？\n",
     "mixed: fullwidth and CJK brackets (Common, extensions Han), U+3006 〆 (Lo, Common) is a letter, not Han"),
    ("第一章\u3000概要\n\n本文。", "U+3000 IDEOGRAPHIC SPACE is White_Space"),
    ("〇一二三〡〢〩数字", "U+3007 and Hangzhou numerals U+3021.. (Nl, Script=Han) are Han"),
    ("中文\u302a\u302d标点", "U+302A..302D ideographic tone marks: Mn, Script=Inherited (extensions Bopomofo, Han)"),
    ("日本・東京", "U+30FB KATAKANA MIDDLE DOT: Po, Script=Common (extensions include Han)"),
    ("㈱会社 ㊗ ㍻", "parenthesized/circled ideographs and era squares: So, Common (extensions Han)"),
    ("｢ﾃｽﾄ｣､｡", "halfwidth CJK punctuation U+FF61..FF64 (Common, extensions include Han), halfwidth katakana"),
    ("々〻時々", "U+3005 / U+303B (Lm, Script=Han) are Han"),
    ("㇀㇁漢字", "CJK strokes U+31C0.. (So, Common, extensions Han)"),
    ("\U00031350\U00031351。", "CJK Extension H (Unicode 15.0, Script=Han, Lo): Han for the Unicode 16 references"),
    ("“世界世世世界世界”—I'm CAN'T 'til 1234\n", "the public llama.cpp Kimi-regex case shape"),
]

WS = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
      0x205F, 0x3000}


def load_ucd(d):
    gc = {}
    first = None
    for line in open(os.path.join(d, "UnicodeData.txt"), encoding="utf-8"):
        f = line.split(";")
        cp, name, cat = int(f[0], 16), f[1], f[2]
        if name.endswith(", First>"):
            first = cp
            continue
        if name.endswith(", Last>"):
            for c in range(first, cp + 1):
                gc[c] = cat
            continue
        gc[cp] = cat
    han = set()
    for line in open(os.path.join(d, "Scripts.txt"), encoding="utf-8"):
        line = line.split("#")[0].strip()
        if not line:
            continue
        rng, sc = [x.strip() for x in line.split(";")]
        if sc != "Han":
            continue
        a, _, b = rng.partition("..")
        han.update(range(int(a, 16), int(b or a, 16) + 1))
    ws = set()
    for line in open(os.path.join(d, "PropList.txt"), encoding="utf-8"):
        line = line.split("#")[0].strip()
        if line and line.split(";")[1].strip() == "White_Space":
            a, _, b = line.split(";")[0].strip().partition("..")
            ws.update(range(int(a, 16), int(b or a, 16) + 1))
    assert ws == WS, "PropList White_Space differs from the set deltafin spells out"
    return gc, han, ws


class Kimi:
    """Kimi's split pattern, alternative by alternative (see the module docstring)."""

    def __init__(self, ucd):
        self.gc, self.han, self.ws = ucd

    def cat(self, c):
        return self.gc.get(ord(c), "Cn")

    def is_han(self, c):
        return ord(c) in self.han

    def is_L(self, c):
        return self.cat(c)[0] == "L"

    def is_N(self, c):
        return self.cat(c)[0] == "N"

    def is_ws(self, c):
        return ord(c) in self.ws

    def X(self, c):  # [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
        k = self.cat(c)
        return (k in ("Lu", "Lt", "Lm", "Lo") or k[0] == "M") and not self.is_han(c)

    def Y(self, c):  # [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
        k = self.cat(c)
        return (k in ("Ll", "Lm", "Lo") or k[0] == "M") and not self.is_han(c)

    def pre(self, c):  # [^\r\n\p{L}\p{N}]
        return c not in "\r\n" and not self.is_L(c) and not self.is_N(c)

    @staticmethod
    def suffix(s, p):  # (?i:'s|'t|'re|'ve|'m|'ll|'d), simple case folding (ſ folds to s)
        if p >= len(s) or s[p] != "'":
            return 0
        fold = {"ſ": "s"}
        for alt in ("s", "t", "re", "ve", "m", "ll", "d"):
            t = s[p + 1:p + 1 + len(alt)]
            if len(t) == len(alt) and "".join(fold.get(ch, ch.lower()) for ch in t) == alt:
                return 1 + len(alt)
        return 0

    def run(self, s, p, pred):
        q = p
        while q < len(s) and pred(s[q]):
            q += 1
        return q

    def alt_letters(self, s, p, x_plus):
        """alternatives 2 (X* Y+) and 3 (X+ Y*), with the optional prefix tried first."""
        starts = [p + 1, p] if p < len(s) and self.pre(s[p]) else [p]
        for q in starts:
            xe = self.run(s, q, self.X)
            for k in range(xe, q - 1, -1):  # X greedy, backtracking
                if x_plus and k == q:
                    break
                ye = self.run(s, k, self.Y)
                if not x_plus and ye == k:
                    continue
                return ye + self.suffix(s, ye)
        return None

    def match(self, s, p):
        n = len(s)
        q = self.run(s, p, self.is_han)  # 1: [\p{Han}]+
        if q > p:
            return q
        for x_plus in (False, True):  # 2, 3
            e = self.alt_letters(s, p, x_plus)
            if e is not None:
                return e
        q = p  # 4: \p{N}{1,3}
        while q < n and q - p < 3 and self.is_N(s[q]):
            q += 1
        if q > p:
            return q
        q = p + 1 if s[p] == " " else p  # 5: " ?[^\s\p{L}\p{N}]+[\r\n]*"
        for q0 in ([q, p] if q > p else [p]):
            e = self.run(s, q0, lambda c: not self.is_ws(c) and not self.is_L(c) and not self.is_N(c))
            if e > q0:
                return self.run(s, e, lambda c: c in "\r\n")
        wq = self.run(s, p, self.is_ws)  # 6: \s*[\r\n]+
        last = max((i for i in range(p, wq) if s[i] in "\r\n"), default=-1)
        if last >= 0:
            return last + 1
        if wq > p:  # 7: \s+(?!\S)   8: \s+
            if wq == n or wq - p >= 2:
                return wq if wq == n else wq - 1
            return wq
        raise AssertionError("no alternative matches at %d in %r" % (p, s))

    def split(self, s):
        out, p = [], 0
        while p < len(s):
            e = self.match(s, p)
            out.append(s[p:e])
            p = e
        return out


def load_ranks(path):
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            b, r = line.split()
            ranks[base64.b64decode(b)] = int(r)
    return ranks


def bpe(piece, ranks):
    """tiktoken's byte_pair_encode: merge the lowest-ranked adjacent pair (leftmost on ties) until none."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, bi = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, bi = r, i
        if bi < 0:
            break
        parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
    return [ranks[p] for p in parts]


def encode(kimi, ranks, s):
    pieces = kimi.split(s)
    return pieces, [i for p in pieces for i in bpe(p.encode("utf-8"), ranks)]


def regex_split(s):
    """Kimi's pattern run verbatim by the Python `regex` module (V1: `&&` is class intersection)."""
    try:
        import regex
    except ImportError:
        return None
    sys.path.insert(0, HERE)
    from make_goldens import KIMI_PAT
    return regex.findall(KIMI_PAT, s, flags=regex.V1)


def check_goldens(kimi, ranks):
    corpus = [json.loads(l) for l in open(os.path.join(ROOT, "tests", "tokenizer", "corpus.jsonl"), encoding="utf-8")]
    ok = bad = 0
    for line in open(os.path.join(ROOT, "tests", "tokenizer", "golden_tok.jsonl"), encoding="utf-8"):
        g = json.loads(line)
        if g["tok"] != "kimi_o200k" or "big" in g:
            continue
        s = base64.b64decode(corpus[g["i"]]["b64"]).decode("utf-8", "replace")
        if len(s) > 25000:  # Kimi's run-length slicing is not modelled here
            continue
        _, ids = encode(kimi, ranks, s)
        if ids == g["ids"]:
            ok += 1
        else:
            bad += 1
            print("MISMATCH #%d %r\n  mine   %s\n  golden %s" % (g["i"], s[:60], ids[:30], g["ids"][:30]))
    print("kimi_o200k goldens reproduced: %d equal, %d differ" % (ok, bad))
    return bad == 0 and ok > 300


def main():
    args = sys.argv[1:]
    ucd_dir, ranks_path = "/usr/share/unicode", os.path.join(ROOT, "tests", ".cache", "tok", "o200k.tiktoken")
    while args and args[0] in ("--ucd", "--ranks"):
        if args[0] == "--ucd":
            ucd_dir = args[1]
        else:
            ranks_path = args[1]
        args = args[2:]
    if not args:
        sys.exit(__doc__)
    if not os.path.exists(os.path.join(ucd_dir, "Scripts.txt")):
        sys.exit("%s/Scripts.txt missing: apt-get install unicode-data (or --ucd DIR)" % ucd_dir)
    kimi = Kimi(load_ucd(ucd_dir))
    ranks = load_ranks(ranks_path)
    if args[0] == "--check-goldens":
        sys.exit(0 if check_goldens(kimi, ranks) else 1)
    if args[0] == "--write":
        if not check_goldens(kimi, ranks):
            sys.exit("the oracle does not reproduce tiktoken's goldens; not writing")
        ver = open(os.path.join(ucd_dir, "ReadMe.txt"), encoding="utf-8").read()
        ver = next((w for w in ver.split() if w[:2].isdigit() and w.count(".") == 2), "?")
        out = os.path.join(ROOT, "tests", "tokenizer", "kimi_cjk.jsonl")
        with open(out, "w", encoding="utf-8") as f:
            for text, note in CASES:
                pieces, ids = encode(kimi, ranks, text)
                rx = regex_split(text)
                if rx is not None and rx != pieces:
                    sys.exit("Python regex splits %r differently: %r vs %r" % (text, rx, pieces))
                f.write(json.dumps({"text": text, "pieces": pieces, "ids": ids, "note": note,
                                    "how": "tools/tokenizer/kimi_presplit.py, UCD %s, o200k ranks%s" %
                                           (ver, ", = Python regex" if rx is not None else "")},
                                   ensure_ascii=False) + "\n")
        print("wrote", out, len(CASES), "cases")
        return
    for text in args:
        pieces, ids = encode(kimi, ranks, text)
        print(json.dumps({"pieces": pieces, "ids": ids, "regex": regex_split(text)}, ensure_ascii=False))


if __name__ == "__main__":
    main()

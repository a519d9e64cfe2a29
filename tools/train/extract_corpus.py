#!/usr/bin/env python3
"""Extract the default model's training corpus (issue 5) as plain text from installed
Debian packages; called by tools/train/build_corpus.sh (which pins and installs them).

Every source is real text written by people: the Python 3.11 manual, Perl's pods, man
pages (Linux man-pages project), WordNet glosses, GCIDE (Webster 1913 based) entries,
the King James Bible, fortunes, the Jargon File, the Bash manual, and C source code
(gnulib, zlib examples, glibc headers). Markup is stripped with groff / pod2text /
Python's html.parser. Documents are deduplicated (whitespace-normalised SHA-256),
shuffled with a fixed seed, and a held-out split of about --heldout-frac of the bytes
is taken from the shuffled order. Output (in --out): train.txt.xz, heldout.txt.xz:
UTF-8 documents separated by the byte 0x1E (never present inside a document).
Only the standard library is used; the result is deterministic for given packages.
"""
import argparse
import base64
import concurrent.futures as cf
import glob
import gzip
import hashlib
import html.parser
import os
import random
import re
import subprocess
import sys

SEP = "\x1e"
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text):
    """Normalise newlines, drop control characters, trailing spaces, long blank runs."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n")
    text = _CTRL.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


class _HtmlText(html.parser.HTMLParser):
    """Plain text of an HTML page; with main_only, only inside <div role="main">."""
    BLOCK = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4",
             "h5", "h6", "tr", "table", "pre", "blockquote", "section", "hr"}

    def __init__(self, main_only):
        super().__init__(convert_charrefs=True)
        self.main_only = main_only
        self.depth_main = 0      # >0 while inside the main div (counts nested divs)
        self.skip = 0            # inside script/style
        self.pre = 0
        self.out = []

    def _on(self):
        return (not self.main_only or self.depth_main > 0) and not self.skip

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "style"):
            self.skip += 1
        if tag == "div":
            if self.depth_main > 0:
                self.depth_main += 1
            elif a.get("role") == "main":
                self.depth_main = 1
        if tag == "a" and "headerlink" in (a.get("class") or ""):
            self.skip += 1
            self._headerlink = True
        if tag == "pre":
            self.pre += 1
        if tag in self.BLOCK and self._on():
            self.out.append("\n\n" if tag in ("p", "pre", "h1", "h2", "h3", "h4", "dt") else "\n")
        if tag == "li" and self._on():
            self.out.append("* ")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)
        if tag == "a" and getattr(self, "_headerlink", False):
            self.skip = max(0, self.skip - 1)
            self._headerlink = False
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in self.BLOCK and self._on():
            self.out.append("\n")
        if tag == "div" and self.depth_main > 0:
            self.depth_main -= 1

    def handle_data(self, data):
        if not self._on():
            return
        if self.pre:
            self.out.append(data)
        else:
            self.out.append(re.sub(r"\s+", " ", data))


def html_text(path, main_only):
    with open(path, encoding="utf-8", errors="replace") as f:
        p = _HtmlText(main_only)
        p.feed(f.read())
        p.close()
    text = "".join(p.out)
    text = "\n".join(line.strip() if not line.startswith("    ") else line.rstrip()
                     for line in text.split("\n"))
    return text


def chunk_paragraphs(text, target):
    """Split a long text at blank lines into pieces of about `target` bytes."""
    out, cur, n = [], [], 0
    for para in text.split("\n\n"):
        cur.append(para)
        n += len(para) + 2
        if n >= target:
            out.append("\n\n".join(cur))
            cur, n = [], 0
    if cur:
        out.append("\n\n".join(cur))
    return out


def src_python_docs():
    root = "/usr/share/doc/python3.11/html"
    skip = re.compile(r"(genindex|py-modindex|search|changelog|/_static/|/_sources/|download|bugs|copyright|license)")
    docs = []
    for path in sorted(glob.glob(root + "/**/*.html", recursive=True)):
        if skip.search(path):
            continue
        t = html_text(path, True)
        if len(t) > 300:
            docs.append(t)
    return docs


def src_perl_pods():
    docs = []
    for path in sorted(glob.glob("/usr/share/perl/5.36/pod/*.pod")):
        r = subprocess.run(["pod2text", "-w", "78", path], capture_output=True)
        t = r.stdout.decode("utf-8", "replace")
        if len(t) > 300:
            docs.append(t)
    return docs


def _render_man(path):
    with gzip.open(path, "rb") as f:
        src = f.read()
    if src.lstrip().startswith(b".so "):
        return ""
    r = subprocess.run(["groff", "-t", "-e", "-man", "-Tutf8", "-P-cbou", "-rLL=78n"],
                       input=src, capture_output=True,
                       env=dict(os.environ, LC_ALL="C.UTF-8"))
    return r.stdout.decode("utf-8", "replace")


def src_man_pages():
    paths = []
    for pkg in ("manpages", "manpages-dev"):
        r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True, check=True)
        paths += [p for p in r.stdout.split("\n")
                  if re.match(r"/usr/share/man/man[0-9]/.*\.gz$", p) and os.path.isfile(p)
                  and not os.path.islink(p)]
    paths = sorted(set(paths))
    with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        docs = list(ex.map(_render_man, paths))
    return [d for d in docs if len(d) > 300]


def _dictd_b64(s):
    alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    v = 0
    for c in s:
        v = v * 64 + alpha.index(c)
    return v


def src_gcide(keep_frac, rng):
    with gzip.open("/usr/share/dictd/gcide.dict.dz", "rb") as f:
        data = f.read()
    spans = set()
    with open("/usr/share/dictd/gcide.index", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3 or parts[0].startswith("00-database"):
                continue
            spans.add((_dictd_b64(parts[1]), _dictd_b64(parts[2])))
    entries = [data[o:o + n].decode("utf-8", "replace") for o, n in sorted(spans)]
    docs = []
    for i in range(0, len(entries), 40):
        if rng.random() < keep_frac:
            docs.append("\n".join(entries[i:i + 40]))
    return docs


def src_wordnet(keep_frac, rng):
    pos_name = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
    lines = []
    for part in ("noun", "verb", "adj", "adv"):
        with open("/usr/share/wordnet/data." + part, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  ") or " | " not in line:
                    continue
                head, gloss = line.split(" | ", 1)
                tok = head.split()
                n = int(tok[3], 16)
                words = [tok[4 + 2 * i].replace("_", " ") for i in range(n)]
                lines.append("%s (%s): %s" % (", ".join(words), pos_name.get(tok[2], tok[2]),
                                              gloss.strip()))
    docs = []
    for i in range(0, len(lines), 50):
        if rng.random() < keep_frac:
            docs.append("\n".join(lines[i:i + 50]))
    return docs


def src_kjv():
    r = subprocess.run(["bible", "-m", "8192", "Gen1:1-Rev22:21"], capture_output=True,
                       env=dict(os.environ, COLUMNS="78"))
    text = r.stdout.decode("utf-8", "replace")
    # One document per chapter: headers are lines like "Genesis 1" / "Song of Solomon 3".
    docs, cur = [], []
    for line in text.split("\n"):
        if re.match(r"^[1-3]?\s?[A-Z][A-Za-z ]+ \d+$", line) and cur:
            docs.append("\n".join(cur))
            cur = []
        cur.append(line)
    if cur:
        docs.append("\n".join(cur))
    return [d for d in docs if len(d) > 100]


def src_fortunes():
    docs = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if "." in os.path.basename(path) or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            items = [x.strip("\n") for x in re.split(r"\n%\n", f.read()) if x.strip()]
        for i in range(0, len(items), 25):
            docs.append("\n%\n".join(items[i:i + 25]))
    return docs


def src_html_books():
    docs = []
    for path in ("/usr/share/doc/jargon-text/jargon.html", "/usr/share/doc/bash/bashref.html"):
        if os.path.exists(path):
            docs += chunk_paragraphs(html_text(path, False), 8000)
    return docs


def src_c_code():
    paths = sorted(glob.glob("/usr/share/gnulib/lib/**/*.[ch]", recursive=True))
    paths += sorted(glob.glob("/usr/share/doc/zlib1g-dev/examples/*.c"))
    paths += sorted(glob.glob("/usr/include/*.h")) + sorted(glob.glob("/usr/include/sys/*.h"))
    docs = []
    for p in paths:
        if os.path.islink(p) or os.path.getsize(p) > 200_000:
            continue
        with open(p, "rb") as f:
            raw = f.read()
        try:
            docs.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return docs


LINUX_DIRS = ("kernel/", "mm/", "lib/", "fs/ext4/", "net/ipv4/", "init/", "ipc/", "block/")


def src_linux_kernel(keep_frac, rng):
    """C files of selected Linux 6.1 directories from linux-source-6.1's tarball (sampled)."""
    import tarfile
    docs = []
    with tarfile.open("/usr/src/linux-source-6.1.tar.xz", "r|xz") as tf:
        for m in tf:
            if not m.isfile() or not re.search(r"\.[ch]$", m.name) or m.size > 200_000:
                continue
            rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
            if not rel.startswith(LINUX_DIRS):
                continue
            raw = tf.extractfile(m).read()
            if rng.random() >= keep_frac:
                continue
            try:
                docs.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                continue
    return docs


SOURCES = [
    # key, description, packages, function
    ("python-docs", "Python 3.11 documentation (HTML, main text only)", "python3.11-doc", src_python_docs),
    ("perl-pods", "Perl 5.36 documentation (pod2text)", "perl-doc", src_perl_pods),
    ("man-pages", "Linux man-pages sections 1-8 (groff -Tutf8)", "manpages, manpages-dev", src_man_pages),
    ("gcide", "GCIDE dictionary entries (sampled groups of 40)", "dict-gcide", None),
    ("wordnet", "WordNet 3.0 synsets and glosses (sampled groups of 50)", "wordnet-base", None),
    ("kjv", "King James Bible, one document per chapter", "bible-kjv-text, bible-kjv", src_kjv),
    ("fortunes", "fortune cookies (groups of 25)", "fortunes, fortunes-min", src_fortunes),
    ("jargon-bash", "Jargon File 4.4.7 and the Bash reference manual (HTML)", "jargon-text, bash-doc", src_html_books),
    ("c-source", "C source: gnulib lib/, zlib examples, glibc headers", "gnulib, zlib1g-dev, libc6-dev", src_c_code),
    ("linux-c", "Linux 6.1 C source: " + " ".join(LINUX_DIRS) + " (sampled files)", "linux-source-6.1", None),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--heldout-frac", type=float, default=0.015)
    ap.add_argument("--gcide-frac", type=float, default=0.60)
    ap.add_argument("--wordnet-frac", type=float, default=0.80)
    ap.add_argument("--linux-frac", type=float, default=0.60)
    ap.add_argument("--md", default=None)
    ap.add_argument("--pkgs", default="")
    a = ap.parse_args()
    rng = random.Random(a.seed)

    all_docs = []   # (source, text)
    stats = {}
    seen = set()
    for key, desc, pkgs, fn in SOURCES:
        if key == "gcide":
            raw = src_gcide(a.gcide_frac, random.Random(a.seed + 1))
        elif key == "wordnet":
            raw = src_wordnet(a.wordnet_frac, random.Random(a.seed + 2))
        elif key == "linux-c":
            raw = src_linux_kernel(a.linux_frac, random.Random(a.seed + 3))
        else:
            raw = fn()
        n_in, n_out, nbytes = len(raw), 0, 0
        for d in raw:
            d = clean(d).replace(SEP, "")
            h = hashlib.sha256(re.sub(r"\s+", " ", d).strip().encode()).digest()
            if h in seen or len(d) < 80:
                continue
            seen.add(h)
            all_docs.append((key, d))
            n_out += 1
            nbytes += len(d.encode("utf-8"))
        stats[key] = (desc, pkgs, n_in, n_out, nbytes)
        print("%-12s docs %6d -> %6d  %10d bytes" % (key, n_in, n_out, nbytes), file=sys.stderr)

    rng.shuffle(all_docs)
    total = sum(len(d.encode()) for _, d in all_docs)
    held, train, hb = [], [], 0
    for src, d in all_docs:
        if hb < a.heldout_frac * total:
            held.append(d)
            hb += len(d.encode())
        else:
            train.append(d)
    os.makedirs(a.out, exist_ok=True)
    outs = {}
    for name, docs in (("train", train), ("heldout", held)):
        txt = os.path.join(a.out, name + ".txt")
        with open(txt + ".tmp", "w", encoding="utf-8") as f:
            f.write(SEP.join(docs))
        os.replace(txt + ".tmp", txt)
        subprocess.run(["xz", "-f", "-T2", "-7", txt], check=True)
        with open(txt + ".xz", "rb") as f:
            outs[name] = (len(docs), len(SEP.join(docs).encode()), os.path.getsize(txt + ".xz"),
                          hashlib.sha256(f.read()).hexdigest())
    if a.md:
        vers = []
        for p in a.pkgs.split():
            name = p.split("=")[0]
            r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True)
            vers.append((name, r.stdout.strip()))
        with open(a.md + ".tmp", "w") as f:
            f.write("# Training corpus of the default model (generated by tools/train/build_corpus.sh)\n\n")
            f.write("Debian 12 packages (name = installed version):\n\n")
            for n, v in vers:
                f.write("- %s = %s\n" % (n, v))
            f.write("\nSeed %d; held-out fraction %.3f of bytes, taken from the shuffled document order; "
                    "gcide sampled at %.2f and wordnet at %.2f of their groups, Linux C files at %.2f.\n\n"
                    % (a.seed, a.heldout_frac, a.gcide_frac, a.wordnet_frac, a.linux_frac))
            f.write("| source | what | packages | docs in | docs kept (dedup) | bytes | share |\n")
            f.write("|---|---|---|---:|---:|---:|---:|\n")
            for key, (desc, pkgs, n_in, n_out, nb) in stats.items():
                f.write("| %s | %s | %s | %d | %d | %d | %.1f%% |\n" % (key, desc, pkgs, n_in, n_out, nb,
                                                                      100.0 * nb / total))
            f.write("| **total** | | | | %d | %d | 100%% |\n\n" % (len(all_docs), total))
            f.write("| split | docs | UTF-8 bytes | xz bytes | sha256 of .xz |\n|---|---:|---:|---:|---|\n")
            for name, (nd, nb, xb, sha) in outs.items():
                f.write("| %s | %d | %d | %d | %s |\n" % (name, nd, nb, xb, sha))
            f.write("\nFormat: UTF-8 documents separated by the byte 0x1E. Files: .trainpack/train.txt.xz, "
                    ".trainpack/heldout.txt.xz (git-ignored; carried to the GPU machine).\n")
        os.replace(a.md + ".tmp", a.md)
    print("train %s heldout %s" % (outs["train"], outs["heldout"]), file=sys.stderr)


if __name__ == "__main__":
    main()

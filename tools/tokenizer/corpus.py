"""corpus.py — the tokenizer golden corpus (>= 300 strings, written for deltafin).

Categories (issue 3): Han beside kana/hangul/Latin; emoji with ZWJ and skin tones;
combining marks; contractions in every case; digit runs of every length; whitespace
runs (spaces, tabs, \\r\\n, mixed); source code and JSON; right-to-left scripts;
special-token strings inside user text; invalid UTF-8 (bytes entries); plus big
inputs generated deterministically from a seed (big_inputs) so they are not stored.

Each entry is (category, value) where value is str, or bytes for invalid UTF-8.
Invalid UTF-8 is defined as: every ill-formed subsequence is replaced by U+FFFD
(maximal subparts, = Python bytes.decode('utf-8', 'replace')) before tokenizing.
"""

def corpus():
    c = []
    def add(cat, *xs):
        for x in xs:
            c.append((cat, x))

    add("latin", "Hello world", "Hello, world!", " leading space", "trailing space ", "  two leading",
        "The quick brown fox jumps over the lazy dog.", "ALL CAPS SENTENCE HERE", "camelCaseIdentifier",
        "snake_case_identifier", "MixedCASEWord", "naïve café résumé", "Ångström über straße",
        "Ünïcödé Ünderscores_and-dashes", "e.g. i.e. etc.", "Mr. O'Neil's dog", "rock 'n' roll",
        "a", "A", "", " ", "ab", "x y z", "Œuvre œuvre Æsir æsir", "ﬁ ligature ﬂ", "ẞ ß",
        "Don’t use curly quotes — or do…", "“quoted” ‘single’ «guillemets» „low“",
        "ÀÁÂÃÄÅàáâãäå", "Ωμέγα ελληνικά", "Привет, мир!", "Съешь же ещё этих мягких французских булок",
        "Tiếng Việt có dấu", "ğüşıöç İstanbul ıi", "Ñandú Peñalolén", "Łódź Żółć", "Čeština ěščřžýáíé")
    add("cjk", "世界", "你好，世界！", "世界世世世界世界", "日本語のテキストです。", "カタカナとひらがな",
        "한국어 텍스트입니다", "漢字かなカナ한글Latin混在", "中文English混合123", "東京タワーはTokyo Towerです",
        "我爱北京天安门", "「かぎかっこ」『二重』", "（全角括弧）【隅付き】", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
        "半角ｶﾀｶﾅ", "𠀀𠀁𠀂 CJK Ext B", "龘靐齉", "こんにちは世界、hello世界", "テスト test テスト",
        "ㄅㄆㄇㄈ bopomofo", "〇一二三四五六七八九十", "中華人民共和國", "한글과 漢字가 섞인 문장", "ﾊﾝｶｸ ｶﾅ",
        "abc世界def", "世界abc", "abc世界", "1世界2", "世界1", "世界 世界", "世界\n世界")
    add("emoji", "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏿‍💻", "🇯🇵🇺🇸", "I ❤️ NY", "🤷‍♀️ shrug",
        "emoji😀inside", "😀😀😀😀😀", "🧑🏻‍🤝‍🧑🏾", "keycap 1️⃣ #️⃣", "👋🏻👋🏼👋🏽👋🏾👋🏿",
        "text 🎉🎊 party", "☕️ coffee", "🫠🫡🫢", "⌚⌛⏰", "©®™", "♠♣♥♦", "→←↑↓⇒")
    add("combining", "e\u0301", "a\u0308o\u0308u\u0308", "n\u0303", "Zalgo: Z\u0351\u0364\u0308a\u0310l\u0357g\u0351o",
        "\u0301leading combining", "क्षत्रिय", "देवनागरी लिपि", "ไทย ภาษา", "ລາວ", "ཀྵ", "각 jamo",
        "x\u20dd", "A\u030a vs \u00c5", "Å (angstrom sign)", "ḱṓ", "q\u0307\u0323", "க்ஷ தமிழ்",
        "बिल्ली", "ಕನ್ನಡ")
    add("contractions", "I'm", "I'M", "i'm", "CAN'T", "can't", "Can't", "'til", "'TIL", "'Til",
        "we're WE'RE We'Re", "they've THEY'VE", "you'll YOU'LL", "he'd HE'D", "it's IT'S It'S",
        "don't DON'T DoN't", "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "o'clock",
        "rock'n'roll", "y'all'd've", "''double''", "' spaced '", "'s'", "ain't AIN'T",
        "I'm CAN'T 'til — “世界世世世界世界” I’m")
    digits = []
    for n in range(1, 26):
        digits.append("".join(str((i * 7 + n) % 10) for i in range(n)))
    add("digits", *digits)
    add("digits", "3.14159", "1,000,000", "1e10", "-42", "+1 (555) 123-4567", "2026-11-29T21:00:00Z",
        "v1.2.3", "0x1F600", "١٢٣٤٥ arabic-indic", "۱۲۳ persian", "१२३ devanagari", "①②③", "Ⅻ roman",
        "½ ¾ ⅓", "²³¹", "12abc34", "abc123def456", "100%", "$9.99", "€1.234,56", "١٠٠٪")
    add("whitespace", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "a  b", "a   b",
        "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a\r\nb", "a \n b", "a  \n\n  b", "line1\nline2\n",
        "    indented", "\tindented tab", "trailing   ", "trailing\t", "trailing\n", " \t \n \r\n ",
        "\u00a0nbsp\u00a0", "em\u2003space", "ideo\u3000space", "a\u2028b", "a\u0085b", "\x0b\x0c",
        "word " + " " * 40 + "word", "\n" * 10, "\t \t \t", "x" + " " * 7 + "\n" + " " * 3 + "y",
        "a\u200bb zero width", "\u180e mongolian vowel sep", "\u202f narrow nbsp", "\u205f mmsp")
    add("code", "def f(x):\n    return x + 1\n", "int main(void) { return 0; }",
        "#include <stdio.h>\nint main(){printf(\"hi\\n\");}", "for (i = 0; i < n; i++) a[i] += b[i];",
        "if x == 1 and y != 2:\n\tpass", "const x = () => { return [1, 2, 3].map(v => v * 2); };",
        "SELECT * FROM users WHERE id = 42;", "git commit -m \"fix: bug\"", "ls -la /usr/local/bin | grep py",
        "https://example.com/path?q=1&r=2#frag", "user@example.com", "<div class=\"a\">x</div>",
        "<html><body><p>Hi</p></body></html>", "// comment\n/* block */", "x<<=2; y>>=3; z**=4;",
        "a->b.c[d]::e", "fn main() { println!(\"{}\", 1); }", "λx.x", "$HOME/.config", "C:\\Windows\\System32",
        "    def method(self):\n        pass\n", "```python\nprint(1)\n```", "#!/bin/sh\nset -eu\n",
        "a=b;c=d;e=f", "!!!???...", "-----", "=====", "*****", "___init___", "__init__.py", "..//..//",
        "{{template}}", "[[wiki]]", "~~strike~~", "@@ -1,3 +1,4 @@", "0.1+0.2!=0.3")
    add("json", "{\"a\": 1, \"b\": [true, false, null]}", "{\"name\":\"deltafin\",\"version\":\"0.1.0\"}",
        "[{\"id\":1},{\"id\":2}]", "{\"text\": \"line\\nbreak\", \"u\": \"\\u00e9\"}",
        "{\n  \"indented\": {\n    \"deep\": [1, 2, 3]\n  }\n}", "{\"emoji\":\"😀\",\"cjk\":\"世界\"}",
        "{\"num\": -1.5e-10}", "[]", "{}", "\"just a string\"")
    add("rtl", "مرحبا بالعالم", "שלום עולם", "العربية 123 English", "עברית עם ניקוד: שָׁלוֹם",
        "فارسی: سلام دنیا", "اردو زبان", "ܐܪܡܝܐ syriac", "ދިވެހި thaana", "mixed ltr مرحبا rtl",
        "\u202eRLO override\u202c", "\u200fRLM mark", "(مرحبا)", "السلام عليكم ورحمة الله", "١٢٣ عربي")
    add("specials", "<|im_end|>", "hello <|im_end|> world", "<|im_start|>user\nhi<|im_end|>",
        "<|endoftext|>", "text<|endoftext|>text", "<think>reasoning</think>answer", "</think>",
        "<｜begin▁of▁sentence｜>", "<｜User｜>hi<｜Assistant｜>", "<｜end▁of▁sentence｜>",
        "<|start|>assistant<|channel|>final<|message|>hi<|end|>", "<|return|>", "<|call|>",
        "[BOS]", "[EOS]", "<|im_user|>user<|im_middle|>hi", "<|im_assistant|>", "<|im_system|>",
        "<|reserved_token_163600|>", "<|tool_call_begin|>", "<|im_end", "im_end|>", "<|im_end|><|im_end|>",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<|fim_prefix|>", "<|vision_pad|>",
        "<|endofprompt|>", "<|startoftext|>", "<|reserved_200017|>", "<<|im_end|>>")
    add("mixed", "The 世界 has 3 emojis 😀👍🏽👨‍👩‍👧 and 'quotes'", "Price: ¥1,234 (≈ $8.50)",
        "Mixed: Ελληνικά, Русский, 日本語, العربية, עברית", "math: ∀x∈ℝ, x²≥0 ∑∫∂√∞",
        "tab\tsep\tvalues\n1\t2\t3", "CSV,with,commas\n\"quoted, field\",2", "Ｈｅｌｌｏ　Ｗｏｒｌｄ",
        "ǅungla ǈudevit (titlecase digraphs)", "ʰʲʷ modifier letters", "ᴬᴮᶜ", "𝐁𝐨𝐥𝐝 𝑰𝒕𝒂𝒍𝒊𝒄 𝔉𝔯𝔞𝔨",
        "Ⓒⓘⓡⓒⓛⓔⓓ", "\x00nul\x00byte", "\x01\x02\x7f control", "bell\x07", "\ufeffBOM at start",
        "\ufffd replacement", "\U0010fffd private", "\ue000 pua", "a\u0000b")
    add("invalid_utf8", b"\xff", b"abc\xffdef", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xf0\x9f\x98",
        b"\xf0\x9f\x98 end", b"\xed\xa0\x80 surrogate", b"\xc0\xaf overlong", b"\xf5\x80\x80\x80",
        b"\x80\x80\x80", b"ok \xe4\xb8 \xe7\x95\x8c", b"\xf4\x90\x80\x80 too big", b"\xfe\xfe\xff\xff")
    # long-ish but small
    add("long", "word " * 200, "\u4e16" * 300, "a" * 500, "'s" * 100, "1" * 100, " " * 100 + "x",
        "\n" * 50 + "x", "ab" * 250, "😀" * 100, "-=" * 100)
    return c


def lcg(seed):
    x = seed & 0xFFFFFFFFFFFFFFFF
    while True:
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        yield x >> 33


def mixed_text(target_bytes, seed, one_line):
    """Deterministic mixed text: corpus strings (valid UTF-8, non-special) picked by
    an LCG and joined by single spaces until >= target_bytes. The C test rebuilds it
    the same way from the corpus file (tests/test_tokenizer.c: mixed_text)."""
    pieces = [v for cat, v in corpus() if isinstance(v, str) and cat not in ("specials", "long") and v]
    if one_line:
        pieces = [p.replace("\r", " ").replace("\n", " ").replace("\u2028", " ").replace("\u0085", " ") for p in pieces]
    enc = [p.encode("utf-8") for p in pieces]
    out = []
    total = 0
    g = lcg(seed)
    while total < target_bytes:
        i = next(g) % len(enc)
        out.append(enc[i])
        total += len(enc[i]) + 1
    return b" ".join(out).decode("utf-8")


def big_inputs():
    """name -> text. Regenerated by the C test from the same rules."""
    return {
        "big_1mb_line": mixed_text(1_000_000, 12345, True),
        "spaces_200k": " " * 200_000 + "x",
        "digits_200k": "".join(str(i % 10) for i in range(200_000)),
        "han_60k": "\u4e16\u754c" * 30_000,
    }


if __name__ == "__main__":
    c = corpus()
    print(len(c), "strings")
    for k, v in big_inputs().items():
        print(k, len(v), len(v.encode()))

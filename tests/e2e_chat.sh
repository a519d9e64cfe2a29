#!/usr/bin/env bash
# e2e_chat.sh — `deltafin chat` end to end on the embedded models/kimi-mini (no --model: the default model, as `run`
# finds it): a piped conversation with /help, an unknown command, an empty line, /clear and EOF (exit 0), stdout
# holding only the replies (each followed by a newline); each greedy reply byte-identical to `run` on the same
# rendered conversation (turn 1: `run --chat --prompt`; turn 2: `run --prompt-ids` of `tokenize --chat`'s ids of the
# conversation with turn 1's reply); --stats showing turn 2 evaluating fewer tokens than the conversation holds (the
# KV cache's common prefix kept) and a new conversation after /clear evaluating all; /exit; --system; the context
# filling (a note, the message dropped, the chat going on); a first message too long for --ctx (a larger --ctx up to
# the model's maximum, also under --ram-budget, or a shorter message; not /clear); --ctx past the model's maximum
# lowered before a --ram-budget reserves its KV cache; stdin or stdout closed; lines of only blanks ignored; a message
# that is not UTF-8; //TEXT; Ctrl-C stopping a reply (the chat goes on), dropping a message while it is tokenized and
# during its prefill (the trained-positions note kept for the conversation that passes them) and ending the chat at
# the prompt (exit 130); the banner and prompt on a terminal only, where a line cut at the terminal's 4095 bytes is
# dropped; bad flags (exit 2 with a message naming them); --help and the top-level help listing chat; --draft DIR and
# ngram (speculative decoding) giving the same replies as without it, greedy and seeded, with --stats' drafting line
# per turn, and a bad --draft path named.
set -u
BIN=${DF_BIN:-build/deltafin}
SRC=${DF_SRC:-.}
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
TMP=$(mktemp -d /tmp/df_e2e_chat.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# conversions go to a cache in $TMP (removed at exit); no registry: the default model is the embedded kimi-mini
export XDG_CACHE_HOME="$TMP/xdg"
export DELTAFIN_REGISTRY="$TMP/no-registry.json"
KM="$SRC/models/kimi-mini"
N=24   # --max-new of the conversations below
C=("$BIN" chat --max-new $N --threads 2)
# expect RC DESCRIPTION REGEX -- command...: exit status RC and stderr+stdout matching REGEX
expect() {
    local want=$1 what=$2 re=$3; shift 4
    local out rc
    out=$("$@" 2>&1 </dev/null); rc=$?
    if [ "$rc" -eq "$want" ] && echo "$out" | grep -qE -- "$re"; then ok "$what"; else bad "$what: rc $rc (want $want), output: $out"; fi
}

# ---- help and bad flags
expect 0 "deltafin --help lists chat" "^  chat +an interactive conversation" -- "$BIN" --help
expect 0 "chat --help" "^usage: deltafin chat \[--model DIR\]" -- "$BIN" chat --help
[ "$("$BIN" help chat 2>&1)" = "$("$BIN" chat --help 2>&1)" ] && ok "help chat = chat --help" || bad "help chat differs from chat --help"
expect 2 "chat --bogus" "^deltafin chat: unknown option '--bogus' \(see deltafin chat --help\)$" -- "$BIN" chat --bogus
expect 2 "chat --temprature 1" "did you mean '--temperature'" -- "$BIN" chat --temprature 1
expect 2 "chat --max-new 0" '^deltafin chat: --max-new "0": expected an integer in \[1, ' -- "$BIN" chat --max-new 0
expect 2 "chat --max-new (no value)" "^deltafin chat: --max-new needs a value" -- "$BIN" chat --max-new
expect 2 "chat --ctx abc" '^deltafin chat: --ctx "abc": expected an integer' -- "$BIN" chat --ctx abc
expect 2 "chat --temperature 3" '^deltafin chat: --temperature "3": expected a number in \[0, 2\]' -- "$BIN" chat --temperature 3
expect 2 "chat --max-new twice" '^deltafin chat: --max-new is given more than once \("5", then "6"\)' -- "$BIN" chat --max-new 5 --max-new 6
expect 2 "chat --thinking --no-thinking" "^deltafin chat: --thinking and --no-thinking contradict each other" -- \
    "$BIN" chat --thinking --no-thinking
expect 2 "chat --backend bogus" "^deltafin chat: .*bogus" -- "$BIN" chat --backend bogus
expect 2 "chat --system <not UTF-8>" "^deltafin chat: --system is not valid UTF-8: invalid byte 0xff" -- "$BIN" chat --system $'\xff'
expect 1 "chat --model <missing>" "^deltafin chat: --model $TMP/nope: no such directory" -- "$BIN" chat --model "$TMP/nope"
mkdir -p "$TMP/nomodel"
expect 1 "chat --model <not a model>" "^deltafin chat: $TMP/nomodel: neither manifest.json" -- "$BIN" chat --model "$TMP/nomodel"

# ---- turn 1 as run generates it: `run --chat` with the same text and --max-new (greedy)
P1="What is a pointer?"
P2="And a function?"
"$BIN" run --chat --prompt "$P1" --max-new $N --threads 2 --quiet >"$TMP/a.txt" 2>"$TMP/a.err" || bad "run --chat: $(cat "$TMP/a.err")"
[ -s "$TMP/a.txt" ] && ok "run --chat reply is not empty" || bad "run --chat gave no text"

# ---- a piped conversation: /help, an unknown command, an empty line, two turns, /clear, the first message again, EOF
printf '%s\n/help\n/bogus\n\n%s\n/clear\n%s\n' "$P1" "$P2" "$P1" | "${C[@]}" --stats >"$TMP/conv.out" 2>"$TMP/conv.err"; rc=$?
[ $rc -eq 0 ] && ok "EOF ends the chat with status 0" || bad "piped conversation: rc $rc: $(cat "$TMP/conv.err")"
grep -q "^model kimi-mini .*; model (no --model): .*models/kimi-mini, embedded kimi-mini.*; chat: context 4096 positions, --max-new $N$" "$TMP/conv.err" \
    && ok "configuration line (the embedded default model, context, --max-new)" || bad "configuration line: $(head -3 "$TMP/conv.err")"
grep -q "^  /clear " "$TMP/conv.err" && grep -q "^  /exit, /quit, /bye " "$TMP/conv.err" && ok "/help lists the commands (on stderr)" \
    || bad "/help: $(cat "$TMP/conv.err")"
[ "$(grep -c "^deltafin chat: unknown command '/bogus'" "$TMP/conv.err")" = 1 ] && ok "unknown command: one line" \
    || bad "unknown command: $(cat "$TMP/conv.err")"
[ "$(grep -c '^stats: turn' "$TMP/conv.err")" = 3 ] && ok "three turns (no model call for the commands and the empty line)" \
    || bad "turns: $(grep '^stats' "$TMP/conv.err")"
# stdout: exactly reply 1, a newline, reply 2, a newline, reply 1 again (a new conversation), a newline
sz=$(wc -c <"$TMP/a.txt")
head -c "$sz" "$TMP/conv.out" >"$TMP/r1"; { cat "$TMP/a.txt"; echo; } >"$TMP/a.line"
cmp -s "$TMP/r1" "$TMP/a.txt" && [ "$(tail -c +$((sz + 1)) "$TMP/conv.out" | head -c 1 | od -An -c | tr -d ' ')" = '\n' ] \
    && ok "turn 1 = run --chat --prompt '$P1' --max-new $N (byte-identical)" \
    || bad "turn 1 differs from run --chat: $(od -c "$TMP/conv.out" | head -5) vs $(od -c "$TMP/a.txt" | head -5)"
tail -c "$((sz + 1))" "$TMP/conv.out" >"$TMP/r3"
cmp -s "$TMP/r3" "$TMP/a.line" && ok "after /clear the same message gives the same reply (a new conversation)" \
    || bad "turn after /clear: $(od -c "$TMP/r3" | head -5)"
total=$(wc -c <"$TMP/conv.out")
tail -c +$((sz + 2)) "$TMP/conv.out" | head -c $((total - 2 * sz - 2)) >"$TMP/r2"   # reply 2 and its newline
[ "$(wc -c <"$TMP/r2")" -gt 1 ] && ok "turn 2's reply is not empty" || bad "turn 2's reply is empty"
# --stats: turn 2 evaluates only what the KV cache does not hold; /clear starts again from nothing
read -r c1 k1 e1 < <(sed -n 's/^stats: turn 1: conversation \([0-9]*\) tokens, \([0-9]*\) reused from the KV cache, \([0-9]*\) evaluated.*/\1 \2 \3/p' "$TMP/conv.err" | head -1)
read -r c2 k2 e2 < <(sed -n 's/^stats: turn 2: conversation \([0-9]*\) tokens, \([0-9]*\) reused from the KV cache, \([0-9]*\) evaluated.*/\1 \2 \3/p' "$TMP/conv.err")
read -r c3 k3 e3 < <(sed -n 's/^stats: turn 1: conversation \([0-9]*\) tokens, \([0-9]*\) reused from the KV cache, \([0-9]*\) evaluated.*/\1 \2 \3/p' "$TMP/conv.err" | tail -1)
[ "${k1:-x}" = 0 ] && [ "${e1:-x}" = "${c1:-y}" ] && ok "turn 1 evaluates its $c1 tokens" || bad "turn 1 stats: $c1 $k1 $e1"
[ -n "${e2:-}" ] && [ "$e2" -lt "$c2" ] && [ "$k2" -gt "$c1" ] && [ $((k2 + e2)) -eq "$c2" ] \
    && ok "turn 2 evaluates $e2 of its $c2 tokens ($k2 reused from the KV cache)" || bad "turn 2 stats: '$c2' '$k2' '$e2'"
[ "${k3:-x}" = 0 ] && [ "${c3:-x}" = "$c1" ] && ok "after /clear: nothing reused, the conversation as at the start" \
    || bad "stats after /clear: $c3 $k3 $e3"
grep -Eq "^stats: turn 2: .*TTFT [0-9.]+ s; reply [0-9]+ tokens?.*; (decode [0-9.]+ tok/s|decode: no decode steps)" "$TMP/conv.err" \
    && ok "--stats: TTFT and decode tok/s" || bad "stats line: $(grep '^stats: turn 2' "$TMP/conv.err")"

# ---- turn 2 as run generates it: the rendered conversation (user, turn 1's reply, user) through tokenize --chat,
# then run --prompt-ids; the token count is --stats' conversation size
if command -v python3 >/dev/null; then
    python3 -c 'import json,sys; print(json.dumps([{"role":"user","content":sys.argv[1]},
        {"role":"assistant","content":open(sys.argv[2],encoding="utf-8").read()},{"role":"user","content":sys.argv[3]}]))' \
        "$P1" "$TMP/a.txt" "$P2" >"$TMP/conv2.json"
    ids=$("$BIN" tokenize --chat <"$TMP/conv2.json" 2>"$TMP/tok.err")
    n2=$(echo "$ids" | tr , '\n' | grep -c .)
    [ "$n2" = "$c2" ] && ok "turn 2's conversation is the rendering's $n2 tokens" || bad "rendered ids $n2 vs stats $c2: $(cat "$TMP/tok.err")"
    "$BIN" run --prompt-ids "$ids" --max-new $N --threads 2 --quiet >"$TMP/b.txt" 2>"$TMP/b.err"
    { cat "$TMP/b.txt"; echo; } >"$TMP/b.line"
    cmp -s "$TMP/r2" "$TMP/b.line" && ok "turn 2 = run --prompt-ids <the rendered conversation> (byte-identical)" \
        || bad "turn 2 differs from run: chat $(od -c "$TMP/r2" | head -4) run $(od -c "$TMP/b.line" | head -4) $(cat "$TMP/b.err")"
    # --system: the system message first, as the rendering of [system, user] says
    python3 -c 'import json,sys; print(json.dumps([{"role":"system","content":"You answer in one line."},{"role":"user","content":sys.argv[1]}]))' \
        "$P1" >"$TMP/sys.json"
    sids=$("$BIN" tokenize --chat <"$TMP/sys.json")
    "$BIN" run --prompt-ids "$sids" --max-new $N --threads 2 --quiet >"$TMP/s.txt" 2>/dev/null; echo >>"$TMP/s.txt"
    printf '%s\n' "$P1" | "${C[@]}" --quiet --system "You answer in one line." >"$TMP/s.out" 2>"$TMP/s.err"
    cmp -s "$TMP/s.out" "$TMP/s.txt" && ok "--system: the reply of run --prompt-ids <rendered [system, user]>" \
        || bad "--system: $(od -c "$TMP/s.out" | head -3) vs $(od -c "$TMP/s.txt" | head -3) $(cat "$TMP/s.err")"
else
    echo "no python3: turn 2 and --system against run are not checked"
fi

# ---- /exit ends the chat (the lines after it are not read); --quiet: nothing on stderr
printf '%s\n/exit\n%s\n' "$P1" "$P2" | "${C[@]}" --quiet >"$TMP/x.out" 2>"$TMP/x.err"; rc=$?
[ $rc -eq 0 ] && cmp -s "$TMP/x.out" "$TMP/a.line" && [ ! -s "$TMP/x.err" ] && ok "/exit: status 0, one reply; --quiet: stderr empty" \
    || bad "/exit: rc $rc, $(od -c "$TMP/x.out" | head -3), stderr: $(cat "$TMP/x.err")"
printf '/quit\n' | "${C[@]}" --quiet >"$TMP/q.out" 2>&1; rc=$?
[ $rc -eq 0 ] && [ ! -s "$TMP/q.out" ] && ok "/quit: status 0, no output" || bad "/quit: rc $rc: $(cat "$TMP/q.out")"
printf '/?\n/bye\nnot sent\n' | "${C[@]}" --quiet >"$TMP/b.out" 2>"$TMP/b.err"; rc=$?
[ $rc -eq 0 ] && [ ! -s "$TMP/b.out" ] && grep -q "^  /clear " "$TMP/b.err" && ok "/? lists the commands, /bye ends the chat" \
    || bad "/? and /bye: rc $rc: $(cat "$TMP/b.out" "$TMP/b.err")"

# ---- the context fills: the reply stops with a note; the next message does not fit (said, dropped); /clear; on
n1=$(sed -n 's/^stats: turn 1: conversation \([0-9]*\) tokens.*/\1/p' "$TMP/conv.err" | head -1)
ctx=$((n1 + 3))
printf '%s\n%s\n/clear\n%s\n' "$P1" "$P2" "$P1" | "$BIN" chat --ctx $ctx --max-new $N --quiet >"$TMP/f.out" 2>"$TMP/f.err"; rc=$?
[ $rc -eq 0 ] && grep -q "^deltafin chat: the context is full ($ctx positions): the reply stops here; /clear starts a new conversation" "$TMP/f.err" \
    && grep -q "^deltafin chat: the conversation with this message is [0-9]* tokens and the context holds $ctx positions: the message is dropped; /clear starts a new conversation" "$TMP/f.err" \
    && [ "$(wc -l <"$TMP/f.out")" -ge 2 ] && ok "--ctx $ctx: context full and a message that does not fit are said; the chat goes on" \
    || bad "context full: rc $rc, stdout $(od -c "$TMP/f.out" | head -3), stderr: $(cat "$TMP/f.err")"

# ---- a message that does not fit a new conversation: no /clear advice (it would not help); under --ram-budget the
# largest --ctx named is the model's maximum (131072, config.json), not the budget's KV reserve (--ctx itself)
printf 'hi\n' | "$BIN" chat --ctx 20 --ram-budget 1G --max-new $N --quiet >"$TMP/g.out" 2>"$TMP/g.err"; rc=$?
[ $rc -eq 0 ] && [ ! -s "$TMP/g.out" ] && grep -q "^deltafin chat: the message in the chat format is [0-9]* tokens and the context holds 20 positions: the message is dropped; a larger --ctx (more than [0-9]*, at most 131072) holds it$" "$TMP/g.err" \
    && ! grep -q "/clear" "$TMP/g.err" && ok "first message too long for --ctx 20 --ram-budget 1G: a larger --ctx (at most the model's 131072)" \
    || bad "first message too long: rc $rc, stderr: $(cat "$TMP/g.err")"
printf 'hi\nhi\n' | "$BIN" chat --ctx $ctx --ram-budget 1G --max-new $N --quiet >"$TMP/g.out" 2>"$TMP/g.err"; rc=$?
[ $rc -eq 0 ] && grep -q "^deltafin chat: the conversation with this message is [0-9]* tokens and the context holds $ctx positions: the message is dropped; /clear starts a new conversation (or a larger --ctx, at most 131072, holds more)$" "$TMP/g.err" \
    && ok "--ram-budget: a later message that does not fit names the model's maximum" || bad "later message, --ram-budget: rc $rc, stderr: $(cat "$TMP/g.err")"
printf 'word %.0s' $(seq 200000) | "$BIN" chat --max-new $N --quiet >"$TMP/g.out" 2>"$TMP/g.err"; rc=$?
[ $rc -eq 0 ] && grep -q "^deltafin chat: the message in the chat format is [0-9]* tokens and the context holds 4096 positions: the message is dropped; the model takes at most 131072 positions: send a shorter message$" "$TMP/g.err" \
    && ok "a message longer than the model's maximum: send a shorter one" || bad "message past the model's maximum: rc $rc, stderr: $(cat "$TMP/g.err")"
# --ctx past the model's maximum is lowered before the model opens: a --ram-budget reserves (and names) that KV cache
out=$("$BIN" chat --ctx 1000000 --ram-budget 200M --quiet 2>&1 </dev/null); rc=$?
[ $rc -eq 1 ] && [ "$(echo "$out" | head -1)" = "deltafin chat: note: --ctx 1000000 is more than the model's maximum of 131072 positions; using 131072" ] \
    && echo "$out" | grep -q "KV cache 240.00 MiB.*the KV cache is for --ctx 131072 positions" \
    && ok "--ctx 1000000 --ram-budget 200M: the note, then the budget error for 131072 positions" || bad "--ctx past the maximum with a budget: rc $rc: $out"
expect 1 "--ram-budget too small without --ctx: the KV cache of the default --ctx" \
    "the KV cache is for 4096 positions \(the default --ctx\)" -- "$BIN" chat --ram-budget 15M --quiet

# ---- stdin or stdout closed: said at the start (not "cannot read stdin: Is a directory" from a model file that took
# descriptor 0); a line of only spaces and tabs is ignored as an empty one
out=$("$BIN" chat --quiet 2>&1 <&-); rc=$?
[ $rc -eq 1 ] && [ "$out" = "deltafin chat: stdin is closed: the chat reads its messages from stdin, one per line (a terminal, a pipe or a file)" ] \
    && ok "stdin closed: one line, status 1" || bad "stdin closed: rc $rc: $out"
out=$(echo hi | "$BIN" chat --quiet 2>&1 >&-); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^deltafin chat: stdout is closed" && ok "stdout closed: one line, status 1" || bad "stdout closed: rc $rc: $out"
printf '   \t \n\t\n' | "${C[@]}" --quiet --stats >"$TMP/w.out" 2>"$TMP/w.err"; rc=$?
[ $rc -eq 0 ] && [ ! -s "$TMP/w.out" ] && [ ! -s "$TMP/w.err" ] && ok "lines of only spaces and tabs are ignored" \
    || bad "blank lines: rc $rc, stdout $(od -c "$TMP/w.out" | head -2), stderr $(cat "$TMP/w.err")"

# ---- a message that is not UTF-8 is refused (the chat goes on); //TEXT is a message, not a command
printf '\xff\n//usr/bin\n' | "${C[@]}" --quiet >"$TMP/u.out" 2>"$TMP/u.err"; rc=$?
[ $rc -eq 0 ] && grep -q "^deltafin chat: the message is not valid UTF-8: invalid byte 0xff at byte offset 0" "$TMP/u.err" \
    && ! grep -q "unknown command" "$TMP/u.err" && [ -s "$TMP/u.out" ] && ok "invalid UTF-8 refused; //usr/bin sent as /usr/bin" \
    || bad "UTF-8 / //TEXT: rc $rc, stderr: $(cat "$TMP/u.err")"

# ---- Ctrl-C: during a reply it stops the reply (kept; the chat goes on), at the prompt it ends the chat (130).
# A long reply: kimi-mini rarely ends its turn, and --max-new and --ctx leave it room for seconds.
mkfifo "$TMP/in"
"$BIN" chat --quiet --max-new 1000000 --ctx 32768 --stats <"$TMP/in" >"$TMP/i.out" 2>"$TMP/i.err" &
pid=$!
exec 3>"$TMP/in"
echo "In the beginning" >&3
for _ in $(seq 100); do [ -s "$TMP/i.out" ] && break; sleep 0.1; done
sleep 0.2
kill -INT $pid 2>/dev/null
for _ in $(seq 100); do grep -q "^stats: turn 1" "$TMP/i.err" && break; sleep 0.1; done
if grep -q "reply interrupted (Ctrl-C) after [0-9]* tokens; it stays in the conversation" "$TMP/i.err"; then
    ok "Ctrl-C during a reply stops it, with a note"
    echo "/help" >&3   # the chat goes on
    for _ in $(seq 50); do grep -q "^  /clear" "$TMP/i.err" && break; sleep 0.1; done
    grep -q "^  /clear" "$TMP/i.err" && ok "the chat goes on after an interrupted reply" || bad "no /help after Ctrl-C: $(cat "$TMP/i.err")"
    sleep 0.3
    kill -INT $pid 2>/dev/null   # at the prompt
    for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    kill -0 $pid 2>/dev/null && { kill $pid; bad "Ctrl-C at the prompt did not end the chat"; }
    wait $pid; rc=$?
    [ $rc -eq 130 ] && ok "Ctrl-C at the prompt: status 130" || bad "Ctrl-C at the prompt: rc $rc: $(cat "$TMP/i.err")"
else
    grep -q "^stats: turn 1: .*+ end of turn" "$TMP/i.err" && { echo "note: the reply ended before Ctrl-C: not checked"; ok "(skipped)"; } \
        || bad "Ctrl-C during a reply: $(cat "$TMP/i.err")"
    kill $pid 2>/dev/null; wait $pid
fi
exec 3>&-

# ---- Ctrl-C while a long message is evaluated drops it; the note past the trained positions (512) is not spent on it
# but given when the conversation does pass them (a 600-token reply)
rm -f "$TMP/in"; mkfifo "$TMP/in"
"$BIN" chat --quiet --max-new 600 --ctx 32768 --stats <"$TMP/in" >"$TMP/k.out" 2>"$TMP/k.err" &
pid=$!
exec 3>"$TMP/in"
printf 'word %.0s' $(seq 20000) >&3; echo >&3
sleep 0.5
kill -INT $pid 2>/dev/null
for _ in $(seq 100); do grep -q "interrupted before the reply began\|^stats: turn 1" "$TMP/k.err" && break; sleep 0.1; done
if grep -q "^deltafin chat: interrupted before the reply began; the message is dropped$" "$TMP/k.err"; then
    grep -q "past the 512 positions" "$TMP/k.err" && bad "the trained-positions note was given for a dropped message: $(cat "$TMP/k.err")" \
        || ok "Ctrl-C during a message's prefill: the message is dropped, no note for it"
    echo "In the beginning" >&3
    exec 3>&-
    wait $pid; rc=$?
    [ $rc -eq 0 ] && grep -q "note: the conversation has reached [0-9]* tokens, past the 512 positions" "$TMP/k.err" \
        && grep -q "^stats: turn 1: conversation [0-9]* tokens, 0 reused" "$TMP/k.err" \
        && ok "the next message's turn passing 512 positions gives the note" || bad "after a dropped message: rc $rc: $(cat "$TMP/k.err")"
else
    echo "note: the prefill ended before Ctrl-C: not checked"; ok "(skipped)"
    exec 3>&-; kill $pid 2>/dev/null; wait $pid
fi

# ---- Ctrl-C while a very long message is rendered and tokenized (before its prefill) drops it and the chat goes on;
# it is not taken for a Ctrl-C at the prompt that ends the chat once the turn is over
yes word | head -n 2000000 | tr '\n' ' ' >"$TMP/big.in"; echo >>"$TMP/big.in"
rm -f "$TMP/in"; mkfifo "$TMP/in"
"$BIN" chat --quiet --max-new 3 <"$TMP/in" >"$TMP/t.out" 2>"$TMP/t.err" &
pid=$!
exec 3>"$TMP/in"
cat "$TMP/big.in" >&3   # returns once the chat has read all but the pipe's last buffer
sleep 0.2
early=0; [ -s "$TMP/t.err" ] && early=1   # the turn was over before Ctrl-C (a fast machine)
kill -INT $pid 2>/dev/null
for _ in $(seq 100); do [ -s "$TMP/t.err" ] && break; sleep 0.1; done
if [ $early = 0 ] && grep -q "the message is dropped; the model takes at most" "$TMP/t.err"; then
    bad "Ctrl-C during a turn (tokenizing) was not taken for the turn: $(cat "$TMP/t.err")"
    exec 3>&-; kill $pid 2>/dev/null; wait $pid
elif grep -q "^deltafin chat: interrupted before the reply began; the message is dropped$" "$TMP/t.err"; then
    echo hi >&3; exec 3>&-
    wait $pid; rc=$?
    [ $rc -eq 0 ] && [ -s "$TMP/t.out" ] && ok "Ctrl-C while a long message is tokenized: dropped, the chat goes on" \
        || bad "Ctrl-C during tokenizing: rc $rc, stdout $(od -c "$TMP/t.out" | head -2), stderr $(cat "$TMP/t.err")"
else
    echo "note: the message was tokenized before Ctrl-C: not checked ($(head -c 200 "$TMP/t.err"))"; ok "(skipped)"
    exec 3>&-; kill $pid 2>/dev/null; wait $pid
fi

# ---- speculative decoding (--draft): the piped conversation above (two turns, /clear, the first message again) with
# a draft model and with ngram, byte-identical to it on stdout; the drafter is told the new history at /clear and
# after the KV cache's common prefix is kept. --draft-gate off drafts from the first token (the gate would mostly keep
# kimi-mini's drafting off), so that verification really runs.
DKM="$SRC/models/kimi-mini-draft"
printf '%s\n/help\n/bogus\n\n%s\n/clear\n%s\n' "$P1" "$P2" "$P1" >"$TMP/conv.in"
for d in "$DKM" ngram "$DKM --draft-gate off" "ngram --draft-gate off --draft-max 4"; do
    # shellcheck disable=SC2086 # $d: --draft's value and more flags
    "${C[@]}" --stats --draft $d <"$TMP/conv.in" >"$TMP/sd.out" 2>"$TMP/sd.err"; rc=$?
    [ $rc -eq 0 ] && cmp -s "$TMP/sd.out" "$TMP/conv.out" && ok "--draft $d: greedy replies byte-identical to the chat without it" \
        || bad "--draft $d: rc $rc, $(cmp "$TMP/sd.out" "$TMP/conv.out" 2>&1), stderr: $(tail -5 "$TMP/sd.err")"
done
# --stats (the last run: ngram, gate off): the drafting line after each turn, as run's
[ "$(grep -cE '^stats: draft ngram: drafted [0-9]+, accepted [0-9]+ \(acceptance [0-9.]+%\), [0-9]+ verifications' "$TMP/sd.err")" = 3 ] \
    && ok "--draft ngram --stats: a drafting line (drafted, accepted, acceptance) after each of the 3 turns" \
    || bad "--draft ngram --stats: $(grep '^stats' "$TMP/sd.err")"
grep -q "^draft: ngram (n 2..4), k max 4 adaptive, gate off" "$TMP/sd.err" && ok "--draft ngram: the draft configuration line" \
    || bad "--draft ngram: no draft line: $(head -3 "$TMP/sd.err")"
"${C[@]}" --stats --draft "$DKM" --draft-gate off <"$TMP/conv.in" >/dev/null 2>"$TMP/sm.err"
drafted=$(sed -n 's/^stats: draft model: drafted \([0-9]*\), accepted \([0-9]*\) (acceptance .*/\1/p' "$TMP/sm.err" | tr '\n' ' ')
accepted=$(sed -n 's/^stats: draft model: drafted \([0-9]*\), accepted \([0-9]*\) (acceptance .*/\2/p' "$TMP/sm.err" | awk '{ s += $1 } END { print s + 0 }')
[ "$(echo "$drafted" | wc -w)" = 3 ] && ! echo " $drafted" | grep -q " 0 " && [ "${accepted:-0}" -gt 0 ] \
    && ok "--draft DIR --draft-gate off --stats: each turn drafts (drafted $drafted; $accepted accepted in all)" \
    || bad "--draft DIR --stats: $(grep '^stats: draft' "$TMP/sm.err")"
grep -q "^stats: turn 2: .*decode [0-9.]* tok/s ([0-9]* tokens in [0-9.]* s, drafting included; the target verified [0-9]* positions" "$TMP/sm.err" \
    && ok "--draft --stats: the decode rate counts the reply's tokens, drafting included" \
    || bad "--draft --stats turn line: $(grep '^stats: turn 2' "$TMP/sm.err")"
# sampled: with a seed, the same sample with the draft model as without it (the sampler's stream runs on across turns)
for t in "--temperature 0.8 --seed 5" "--temperature 1.2 --top-k 40 --seed 3"; do
    # shellcheck disable=SC2086
    "${C[@]}" --quiet $t <"$TMP/conv.in" >"$TMP/ss0.out" 2>/dev/null
    # shellcheck disable=SC2086
    "${C[@]}" --quiet $t --draft "$DKM" --draft-gate off <"$TMP/conv.in" >"$TMP/ss1.out" 2>"$TMP/ss1.err"; rc=$?
    [ $rc -eq 0 ] && [ -s "$TMP/ss0.out" ] && cmp -s "$TMP/ss0.out" "$TMP/ss1.out" \
        && ok "$t: the same replies with --draft DIR as without it" \
        || bad "$t --draft: rc $rc, $(cmp "$TMP/ss0.out" "$TMP/ss1.out" 2>&1) $(cat "$TMP/ss1.err")"
done
cmp -s "$TMP/ss0.out" "$TMP/conv.out" && bad "sampled replies equal the greedy ones (sampling not exercised)" \
    || ok "sampled replies differ from the greedy ones"
# Ctrl-C during a drafted reply stops it (checked between tokens) and the chat goes on to the next message
mkfifo "$TMP/din"
"$BIN" chat --quiet --max-new 1000000 --ctx 32768 --stats --draft ngram --draft-gate off <"$TMP/din" >"$TMP/di.out" 2>"$TMP/di.err" &
pid=$!
exec 4>"$TMP/din"
echo "In the beginning" >&4
for _ in $(seq 100); do [ -s "$TMP/di.out" ] && break; sleep 0.1; done
sleep 0.2
kill -INT $pid 2>/dev/null
for _ in $(seq 100); do grep -q "^stats: draft ngram" "$TMP/di.err" && break; sleep 0.1; done
if grep -q "reply interrupted (Ctrl-C) after [0-9]* tokens; it stays in the conversation" "$TMP/di.err"; then
    ok "--draft: Ctrl-C during a reply stops it, with a note"
else
    grep -q "^stats: turn 1: .*+ end of turn" "$TMP/di.err" && { echo "note: the reply ended before Ctrl-C: not checked"; ok "(skipped)"; } \
        || bad "--draft: Ctrl-C during a reply: $(cat "$TMP/di.err")"
fi
printf '/exit\n' >&4
exec 4>&-
for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -0 $pid 2>/dev/null && { kill $pid; bad "--draft: /exit after an interrupted reply did not end the chat"; }
wait $pid; rc=$?
[ $rc -eq 0 ] && ok "--draft: the chat goes on after an interrupted reply (/exit: status 0)" || bad "--draft after Ctrl-C: rc $rc: $(cat "$TMP/di.err")"
# bad --draft values: said before the target model is opened
expect 1 "chat --draft <missing>" "^deltafin chat: --draft $TMP/nodraft: no such directory \(expected a draft model directory, ngram or off\)$" -- \
    "$BIN" chat --draft "$TMP/nodraft"
expect 2 "chat --draft-max 0" '^deltafin chat: --draft-max "0": expected an integer in \[1, 64\]' -- "$BIN" chat --draft-max 0
expect 2 "chat --draft twice" '^deltafin chat: --draft is given more than once' -- "$BIN" chat --draft ngram --draft off
expect 2 "chat --draft-gat on" "did you mean '--draft-gate'" -- "$BIN" chat --draft-gat on
expect 0 "chat --draft-max without --draft: a note" "deltafin chat: note: --draft-max has no effect without --draft" -- \
    "$BIN" chat --draft-max 4 --quiet

# ---- on a terminal: the banner (model name, how to end) and the "> " prompt on stderr
if command -v script >/dev/null; then
    printf '%s\n' "$P1" >"$TMP/tty.in"
    script -qec "$(printf '%q ' "${C[@]}")" /dev/null <"$TMP/tty.in" >"$TMP/tty.out" 2>&1
    grep -q "deltafin chat with kimi-mini (context 4096 positions).*/exit or Ctrl-D ends the chat" "$TMP/tty.out" && grep -q "^> " "$TMP/tty.out" \
        && ok "terminal: banner and prompt" || bad "terminal: $(cat -A "$TMP/tty.out" | head -5)"
    # a line the terminal cut at its 4095-byte limit is dropped with a note, not answered in part
    { head -c 6000 /dev/zero | tr '\0' a; echo; } >"$TMP/long.in"
    script -qec "$(printf '%q ' "${C[@]}") --quiet --stats" /dev/null <"$TMP/long.in" >"$TMP/long.out" 2>&1
    grep -q "deltafin chat: the line reached the terminal's limit of 4095 bytes, so the terminal most likely cut it there: the message is dropped" "$TMP/long.out" \
        && ! grep -q "^stats: turn" "$TMP/long.out" && ok "terminal: a line cut at 4095 bytes is dropped with a note" \
        || bad "terminal, long line: $(tail -c 600 "$TMP/long.out")"
else
    echo "no script(1): the terminal case is skipped"
fi
grep -q "deltafin chat with\|^> " "$TMP/conv.err" "$TMP/conv.out" && bad "piped: a banner or prompt was printed" || ok "piped: no banner, no prompt"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

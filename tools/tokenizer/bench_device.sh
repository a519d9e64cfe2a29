#!/usr/bin/env bash
# bench_device.sh — deltafin tokenizer throughput on the GPU machine (run through the device tool with
# carry tests/.cache/tok/{deepseek_v3,qwen3,gptoss,o200k.tiktoken,o200k_config.json} and tests/.cache/tokbench):
# the 10 MB mixed text of make_goldens.py bench, plus long runs (1 MB spaces, 1 MB '!') for deltafin and,
# with a 60 s cap each, for HF tokenizers. Output to $OUT/bench2.txt.
set -u
C=tests/.cache/tok; B=tests/.cache/tokbench; O="${OUT:-/tmp}/bench2.txt"
export LD_LIBRARY_PATH=$B
python3 -c "
import sys; sys.path.insert(0, 'tools/tokenizer'); from corpus import mixed_text
open('/tmp/bench10mb.txt', 'wb').write(mixed_text(10_000_000, 777, False).encode())
open('/tmp/sp1m.txt', 'w').write(' ' * 1_000_000 + 'x'); open('/tmp/ex1m.txt', 'w').write('!' * 1_000_000)"
{
  date -u
  for f in /tmp/bench10mb.txt /tmp/sp1m.txt /tmp/ex1m.txt; do
    echo "== $f"
    for m in deepseek_v3 qwen3 gptoss; do [ -f $C/$m/tokenizer.json ] && $B/tok_bench $C/$m/tokenizer.json $f 3; done
    $B/tok_bench $C/o200k.tiktoken --config $C/o200k_config.json $f 3
  done
  for f in /tmp/sp1m.txt /tmp/ex1m.txt; do
    timeout 60 python3 -c "
import sys, time
from tokenizers import Tokenizer
t = Tokenizer.from_file('$C/deepseek_v3/tokenizer.json'); s = open('$f').read()
t0 = time.perf_counter(); n = len(t.encode(s, add_special_tokens=False).ids)
print('hf-tokenizers deepseek_v3 $f %.3f s %d ids' % (time.perf_counter() - t0, n))" || echo "hf-tokenizers deepseek_v3 $f: over 60 s"
  done
} 2>&1 | tee "$O"

#!/usr/bin/env python3
# gpu_gaps.py CSV [FRACTION] — where a GPU timeline idles: from `nsys stats --report cuda_gpu_trace --format csv`
# (one row per kernel / copy: Start (ns), Duration (ns), Name), over the last FRACTION (default 0.4) of the events
# (a run's decode after its prompt): the span, the busy time (union of the intervals), and the idle gaps over 2 us
# summed by the pair of operations around them.
import csv, re, sys, collections

rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.strip()]
hdr = next(i for i, l in enumerate(lines) if "Start" in l and "Duration" in l)
for r in csv.DictReader(lines[hdr:]):
    try:
        s, d = float(r["Start (ns)"]), float(r["Duration (ns)"])
    except (KeyError, ValueError):
        continue
    n = re.sub(r"\(.*", "", r.get("Name", "?")).replace("<unnamed>::", "").replace("void ", "")[:48]
    rows.append((s, s + d, n))
rows.sort()
frac = float(sys.argv[2]) if len(sys.argv) > 2 else 0.4
rows = rows[int(len(rows) * (1 - frac)):]
if not rows:
    sys.exit("no events")
span = rows[-1][1] - rows[0][0]
busy, end, gaps = 0.0, rows[0][0], collections.defaultdict(lambda: [0, 0.0])
prev = "start"
for s, e, n in rows:
    if s > end:
        g = s - end
        if g > 2000:
            k = "%s -> %s" % (prev, n)
            gaps[k][0] += 1
            gaps[k][1] += g
    busy += max(0.0, e - max(s, end))
    if e > end:
        end, prev = e, n
print("gaps: %d events, span %.3f ms, busy %.3f ms (%.1f%%), idle %.3f ms" % (len(rows), span / 1e6, busy / 1e6,
      100 * busy / span, (span - busy) / 1e6))
for k, (c, t) in sorted(gaps.items(), key=lambda kv: -kv[1][1])[:12]:
    print("gaps: %8.3f ms  x%-5d %6.1f us each  %s" % (t / 1e6, c, t / c / 1e3, k))

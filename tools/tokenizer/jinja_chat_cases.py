"""jinja_chat_cases.py — conversations for the real-template goldens
(make_jinja_goldens.py): system / developer messages, tools, tool calls with
string and object arguments, tool results (also out of call order), reasoning
content, inline <think>, multi-turn, unicode, content parts, names. Each
template renders each conversation with several (add_generation_prompt,
kwargs) variants; where jinja2 raises, deltafin must refuse too."""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city — 天気",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. 東京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer", "description": "Forecast days", "minimum": 1.0, "maximum": 14}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "What to look for"},
        "top_k": {"type": "number", "description": "How many"},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Filters"},
        "safe": {"type": "boolean", "description": "Safe search"}},
        "required": ["query", "safe"]}}}
NOARGS = {"type": "function", "function": {"name": "now", "description": "Current time",
                                           "parameters": {"type": "object", "properties": {}}}}


def call(cid, name, args):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid is not None:
        c = {"id": cid, **c}
    return c


def cases():
    """List of (name, messages, tools)."""
    return [
        ("user_only", [{"role": "user", "content": "Hello!"}], None),
        ("system_user", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}], None),
        ("developer_user", [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}], None),
        ("multi_turn", [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "What is 2+2?"},
                        {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"},
                        {"role": "assistant", "content": "6."}, {"role": "user", "content": "Thanks"}], None),
        ("unicode", [{"role": "user", "content": "世界 😀 مرحبا\nnew line\ttab \"quotes\" 'single' back\\slash é"},
                     {"role": "assistant", "content": "Ответ: ✓ «ok» 👨‍👩‍👧"}, {"role": "user", "content": "ok?"}], None),
        ("specials_in_text", [{"role": "user", "content": "Is <|im_end|> or <|end_of_msg|> or <|open|>x<|sep|> or {{ x }} special?"}], None),
        ("empty_content", [{"role": "system", "content": ""}, {"role": "user", "content": ""}], None),
        ("whitespace_content", [{"role": "user", "content": "  leading and trailing  \n\n"},
                                {"role": "assistant", "content": "\nanswer\n"}, {"role": "user", "content": "ok"}], None),
        ("tools_declared", [{"role": "system", "content": "Use tools when needed."},
                            {"role": "user", "content": "Weather in Tokyo?"}], [WEATHER, SEARCH]),
        ("tools_no_system", [{"role": "user", "content": "What time is it?"}], [NOARGS]),
        ("tool_call_result", [{"role": "user", "content": "Weather in Paris?"},
                              {"role": "assistant", "content": None,
                               "tool_calls": [call("call_1", "get_weather", "{\"city\": \"Paris\", \"days\": 2}")]},
                              {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                               "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
                              {"role": "assistant", "content": "It is 21°C and clear in Paris."},
                              {"role": "user", "content": "Thanks"}], [WEATHER]),
        ("tool_call_empty_content", [{"role": "user", "content": "Weather in Paris?"},
                                     {"role": "assistant", "content": "",
                                      "tool_calls": [call("functions.get_weather:0", "get_weather", "{\"city\":\"Paris\"}")]},
                                     {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"}],
         [WEATHER]),
        ("tool_call_dict_args", [{"role": "user", "content": "Search for cats"},
                                 {"role": "assistant", "content": "Let me search.",
                                  "tool_calls": [call("c9", "search", {"query": "cats 猫", "top_k": 3.0, "tags": ["pets", "fun"],
                                                                       "safe": True, "extra": None})]},
                                 {"role": "tool", "tool_call_id": "c9", "content": "[\"a\", \"b\"]"},
                                 {"role": "assistant", "content": "Found two."}], [SEARCH]),
        ("two_tool_calls", [{"role": "system", "content": "sys"}, {"role": "user", "content": "Compare Oslo and Rome"},
                            {"role": "assistant", "content": None,
                             "tool_calls": [call("c1", "get_weather", "{\"city\": \"Oslo\"}"),
                                            call("c2", "get_weather", "{\"city\": \"Rome\"}")]},
                            {"role": "tool", "tool_call_id": "c2", "name": "get_weather", "content": "18"},
                            {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "-3"}],
         [WEATHER]),
        ("tool_call_no_id", [{"role": "user", "content": "Time?"},
                             {"role": "assistant", "content": "",
                              "tool_calls": [{"type": "function", "function": {"name": "now", "arguments": "{}"}}]},
                             {"role": "tool", "name": "now", "content": "12:00"}], [NOARGS]),
        ("reasoning_content", [{"role": "user", "content": "Think: 17*3?"},
                               {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51."},
                               {"role": "user", "content": "Now 18*3?"},
                               {"role": "assistant", "content": "54", "reasoning_content": "18*3 = 54"}], None),
        ("reasoning_then_user", [{"role": "user", "content": "Think: 17*3?"},
                                 {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51."},
                                 {"role": "user", "content": "Sure?"}], None),
        ("reasoning_tool_call", [{"role": "user", "content": "Weather in Oslo?"},
                                 {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
                                  "tool_calls": [call("c1", "get_weather", "{\"city\": \"Oslo\"}")]},
                                 {"role": "tool", "tool_call_id": "c1", "content": "-3"}], [WEATHER]),
        ("inline_think", [{"role": "user", "content": "q1"},
                          {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA1"},
                          {"role": "user", "content": "q2"}], None),
        ("content_parts", [{"role": "user", "content": [{"type": "text", "text": "part one, "},
                                                        {"type": "text", "text": "part two"}]}], None),
        ("named_user", [{"role": "user", "name": "alice", "content": "Hi, I am Alice"}], None),
        ("multi_system", [{"role": "system", "content": "First."}, {"role": "user", "content": "u1"},
                          {"role": "system", "content": "Second."}, {"role": "user", "content": "u2"}], None),
        ("assistant_first", [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}], None),
    ]


def variants(template):
    """(add_generation_prompt, kwargs) pairs rendered for a template."""
    v = [(True, {}), (False, {})]
    if template in ("qwen3",):
        v += [(True, {"enable_thinking": False}), (True, {"enable_thinking": True})]
    if template.startswith("kimi-k3"):
        v += [(True, {"thinking": False}), (True, {"thinking": True, "thinking_effort": "low"}),
              (True, {"tool_choice": "required"}), (True, {"tool_choice": "none", "thinking": False}),
              (True, {"response_format": {"type": "json_object"}}),
              (True, {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
                  "type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}},
                  "required": ["a"]}}}}),
              (True, {"thinking_effort": "bogus"})]
    if template == "gpt-oss":
        v += [(True, {"reasoning_effort": "high"}),
              (True, {"builtin_tools": ["browser", "python"], "model_identity": "You are a test model."})]
    return v

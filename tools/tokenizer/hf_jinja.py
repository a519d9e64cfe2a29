"""hf_jinja.py — jinja2 with exactly the environment transformers renders chat
templates in (src/transformers/utils/chat_template_utils.py,
_cached_compile_jinja_template): ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]), its tojson
filter (json.dumps with ensure_ascii / indent / separators / sort_keys),
raise_exception and strftime_now; and apply_chat_template's variables:
render(messages=..., tools=..., documents=None, add_generation_prompt=...,
**{**special_tokens_map, **kwargs}).

The {% generation %} tag of transformers' AssistantTracker is reproduced as a
tag that renders its body. strftime_now uses a fixed clock when DF_CHAT_NOW
(unix seconds) is set, as deltafin does.
"""
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _Generation(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

    def _gen(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    fixed = os.environ.get("DF_CHAT_NOW")
    now = datetime.fromtimestamp(int(fixed)) if fixed else datetime.now()
    return now.strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = environment()


def compile_template(src):
    return _ENV.from_string(src)


def special_tokens_map(config):
    """transformers' special_tokens_map from a tokenizer_config.json dict: the set
    (truthy) ones of bos/eos/unk/sep/pad/cls/mask as strings (AddedToken dicts
    give their content), and additional_special_tokens."""
    out = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = config.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if v:
            out[k] = v
    extra = config.get("additional_special_tokens")
    if extra:
        out["additional_special_tokens"] = [t.get("content") if isinstance(t, dict) else t for t in extra]
    return out


def render_chat(template_src, messages, tools=None, add_generation_prompt=False, special_tokens=None, **kwargs):
    """What tokenizer.apply_chat_template(..., tokenize=False) returns."""
    t = compile_template(template_src)
    kw = {**(special_tokens or {}), **kwargs}
    return t.render(messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **kw)

#!/usr/bin/env python3
"""Expected chat-template renderings, written by transformers itself.

For every template in tests/fixtures/chat/templates/ (real templates of the
supported families, see the README there) and a fixed set of conversations,
render the conversation with transformers' own chat-template path
(transformers.utils.chat_template_utils.render_jinja_template, the function
apply_chat_template calls, with the tokenizer's special tokens as keyword
arguments as apply_chat_template passes them) and write
tests/fixtures/chat/expected/<template>.json. ctest's test-chat-template
renders the same cases with the C interpreter (moe-chat.h) and compares bytes.

CI does not run this script; it needs `pip install transformers jinja2` (no
torch). strftime_now is pinned to a fixed time (NOW below) so that templates
that print the date (gpt-oss) render the same on every run; the C test passes
the same time. A case the template refuses (raise_exception) is recorded with
the error message instead of an output.

    python3 tests/oracle/gen_chat_fixtures.py            # all templates
    python3 tests/oracle/gen_chat_fixtures.py --only qwen3 gpt-oss
    python3 tests/oracle/gen_chat_fixtures.py --only features

expected/features.json holds small templates of this script's own (FEATURES:
whitespace control, scoping, loops, macros, filters, tests, methods, tojson),
each case with its source, rendered the same way.
"""
import argparse
import datetime as _dt
import json
import os
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "chat")
NOW = 1741964966  # 2025-03-14 15:09:26 UTC

# special tokens of each template's tokenizer (None: the tokenizer has none,
# so the name is undefined in the template, as in transformers)
TOKENS = {
    "mistral-v0": ("<s>", "</s>"),
    "mistral-v1": ("<s>", "</s>"),
    "mistral-nemo-instruct-2407": ("<s>", "</s>"),
    "qwen2.5-instruct": (None, "<|im_end|>"),
    "qwen3": (None, "<|im_end|>"),
    "qwen3-coder": (None, "<|im_end|>"),
    "phi-3.5-instruct": ("<s>", "<|endoftext|>"),
    "deepseek-v2": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-v3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-r1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "llama-cpp-deepseek-r1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "gpt-oss": ("<|startoftext|>", "<|return|>"),
}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! What is 2+2?"}
A1 = {"role": "assistant", "content": "2+2 is 4."}
U2 = {"role": "user", "content": "And 3+3?"}
UNI = {"role": "user", "content": "Grüße aus Zürich — 世界 😀, «ça va?» ¿Qué tal? ñ"}
TRICKY = {"role": "user", "content": "He said \"hi\" and 'bye'.\nNew line\ttab {{ not a tag }} {% raw %} {# x #} \\n back\\slash  "}
A_UNI = {"role": "assistant", "content": "  Привет!  Ответ: 4 ✓\n"}
THINK = {"role": "assistant", "content": "<think>\nLet me add.\n</think>\n\n2+2 is 4."}
REASON = {"role": "assistant", "content": "2+2 is 4.", "reasoning_content": "Adding two and two."}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]
TOOL_CALL = {"role": "assistant", "tool_calls": [{"id": "abcDEF123", "type": "function", "function": {
    "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}
U_W = {"role": "user", "content": "What is the weather in Paris?"}

# (name, messages, extra template variables or None)
CONVERSATIONS = [
    ("system_user", [SYS, U1], None),
    ("user", [U1], None),
    ("multi_turn", [U1, A1, U2], None),
    ("system_multi_turn", [SYS, U1, A1, U2], None),
    ("assistant_last", [U1, A1], None),
    ("non_ascii", [SYS, UNI, A_UNI, U2], None),
    ("quotes_newlines_braces", [TRICKY], None),
    ("think_in_content", [U1, THINK, U2], None),
    ("reasoning_content", [U1, REASON, U2], None),
    ("tools", [U_W], {"tools": TOOLS}),
    ("tool_call_round_trip", [SYS, U_W, TOOL_CALL, TOOL_RESULT], {"tools": TOOLS}),
    ("empty_system", [{"role": "system", "content": ""}, U1], None),
]
EXTRA_CASES = {  # template-specific variables (chat_template_kwargs)
    "qwen3": [("no_thinking", [U1], {"enable_thinking": False})],
    "deepseek-v3.1": [("thinking", [U1, A1, U2], {"thinking": True})],
    "deepseek-r1": [("enable_thinking", [U1], {"enable_thinking": True})],
    "gpt-oss": [("reasoning_high", [SYS, U1], {"reasoning_effort": "high", "model_identity": "You are a test model."}),
                ("builtin_tools", [U1], {"builtin_tools": ["browser", "python"]})],
}


# Small templates for the semantics the real ones touch only in passing:
# whitespace control, scoping, loops, macros, filters, tests, methods, tojson.
# Rendered with messages = [SYS, U1, A1, U2] and the variables in FEATURE_VARS.
FEATURE_VARS = {"bos_token": "<s>", "eos_token": "</s>", "obj": {"b": 2, "a": [1, 2.5, None, True], "c": "x\"y"},
                "words": ["Banana", "apple", "cherry", "apple"], "n": 7, "s": "  Hello, World! ", "f": 0.1,
                "u": "ñandú Straße"}
FEATURES = [
    ("ws_trim_lstrip", "A\n  {% if true %}\n  B\n  {% endif %}\nC\n{# c #}\n  {{ 'D' }}\n"),
    ("ws_dash", "A  \n  {%- if true -%}  \n B {{- ' C ' -}} \n D{%+ if true %} E{% endif +%}\nF {% endif %}"),
    ("ws_raw", "{% raw %}{{ not rendered }}{% endraw %}|{%- raw -%}  x  {%- endraw -%}|"),
    ("trailing_newline", "x\n"),
    ("crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc"),
    ("for_loop", "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}"
                 "{{ '^' if loop.first }}{{ '$' if loop.last }}:{{ m.role }};{% endfor %}"),
    ("for_filter_else", "{% for m in messages if m.role == 'user' %}{{ loop.index }}={{ m.content }}|{% else %}none{% endfor %}"
                        "{% for x in [] %}x{% else %}empty{% endfor %}"),
    ("for_items_unpack", "{% for k, v in obj.items() %}{{ k }}={{ v }};{% endfor %}{% for k in obj %}{{ k }}{% endfor %}"),
    ("loop_prev_next_cycle", "{% for w in words %}{{ loop.previtem }}>{{ w }}>{{ loop.nextitem }}:{{ loop.cycle('a','b') }} {% endfor %}"),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
    ("scoping", "{% set x = 1 %}{% for i in range(3) %}{% set x = x + i %}{{ x }}{% endfor %}:{{ x }}"
                "{% set ns = namespace(t=0) %}{% for i in range(4) %}{% set ns.t = ns.t + i %}{% endfor %}:{{ ns.t }}"
                "{% if true %}{% set y = 5 %}{% endif %}:{{ y }}"),
    ("set_block_tuple", "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set blk %}[{{ a }}]{% endset %}{{ blk }}{{ blk | length }}"),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }}"
              " {{ greet(punct='.', name='C') }}{% macro fact(k) %}{{ 1 if k <= 1 else k * fact(k - 1) | int }}{% endmacro %} {{ fact(5) }}"),
    ("literals", "{{ 1 }} {{ -2 }} {{ 3.0 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 // 2 }}"
                 " {{ -7 % 3 }} {{ 2 ** 10 }} {{ 'a' ~ 1 ~ none }} {{ none }} {{ true }} {{ [1, 'b', none, 2.0] }}"
                 " {{ {'k': 'v', 'n': [1]} }} {{ (1,) }} {{ 'it\\'s' }} {{ \"q\\\"q\" }} {{ '\\u00e9\\t|' }} {{ 'a' 'b' }}"),
    ("compare_logic", "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 'ell' in 'hello' }}"
                      " {{ 3 not in [1, 2] }} {{ 'b' in obj }} {{ none or 'x' }} {{ 0 and 1 }} {{ not '' }} {{ 'y' if n > 5 else 'z' }}"
                      " {{ 'q' if false }}|"),
    ("subscript_slice", "{{ words[0] }} {{ words[-1] }} {{ words[1:3] }} {{ words[::-1] }} {{ words[::2] }} {{ u[1:4] }}"
                        " {{ u[::-1] }} {{ s[2:-2] }} {{ messages[1]['content'][:5] }} {{ obj.c }} {{ obj['a'][1] }} {{ words[10] }}|"),
    ("tests", "{{ x is defined }} {{ obj is defined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ true is number }}"
              " {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ obj is mapping }} {{ words is iterable }} {{ 'x' is iterable }}"
              " {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ words is sequence }} {{ obj is sameas obj }}"
              " {{ 'abc' is lower }} {{ 2 is eq 2 }} {{ 'a' is in 'abc' }} {{ x is undefined }} {{ false is false }}"),
    ("filters_str", "{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello wORLD-foo (bar' | title }}|{{ 'hELLO' | capitalize }}"
                    "|{{ s | replace('l', 'L') }}|{{ s | replace('l', '', 1) }}|{{ s | length }}|{{ u | length }}|{{ u | upper }}"
                    "|{{ s | trim('! ') }}|{{ 'x' | string }}|{{ 42 | string }}|{{ '<a & \"b\">' | escape }}|{{ 'one two  three' | wordcount }}"),
    ("filters_seq", "{{ words | join(', ') }}|{{ words | length }}|{{ words | first }}|{{ words | last }}|{{ words | sort }}"
                    "|{{ words | sort(reverse=true, case_sensitive=true) }}|{{ words | unique | list }}|{{ words | reverse | list }}"
                    "|{{ [3, 1, 2] | max }}|{{ [3, 1, 2] | min }}|{{ [1, 2, 3] | sum }}|{{ obj | dictsort }}|{{ obj | items | list }}"
                    "|{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
                    "|{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }}|{{ [0, 1, '', 'a'] | select | list }}"
                    "|{{ [1, 2, 3, 4] | reject('odd') | list }}|{{ words | map('upper') | list }}|{{ 'abc' | list }}"),
    ("filters_num", "{{ '12' | int }} {{ 3.9 | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ '2.5' | float }} {{ -3 | abs }}"
                    " {{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ 2.7 | round(0, 'floor') }} {{ n | default(1) }} {{ nope | default('d') }}"
                    " {{ '' | default('e', true) }} {{ none | default('f') }}"),
    ("indent", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb\\n' | indent('> ', blank=true) }}|{{ 'x\\n' | indent }}|"),
    ("tojson", "{{ obj | tojson }}|{{ obj | tojson(indent=2) }}|{{ words | tojson(separators=(',', ':')) }}|{{ obj | tojson(sort_keys=true) }}"
               "|{{ u | tojson }}|{{ u | tojson(ensure_ascii=true) }}|{{ 'a\\nb\\t\"c\\\\' | tojson }}|{{ [] | tojson }}|{{ {} | tojson(indent=4) }}"
               "|{{ 1.0 | tojson }}|{{ none | tojson }}|{{ messages[0] | tojson(indent='\\t') }}"),
    ("methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}"
                "|{{ 'a,b,c'.rsplit(',', 1) }}|{{ s.startswith('  He') }}|{{ s.endswith(('x', '! ')) }}|{{ u.upper() }}|{{ 'ab cd'.title() }}"
                "|{{ 'xyz'.replace('y', 'YY') }}|{{ 'hello'.find('l') }}|{{ 'hello'.rfind('l') }}|{{ 'hello'.count('l') }}"
                "|{{ '-'.join(words) }}|{{ obj.get('b') }}|{{ obj.get('zz', 'dflt') }}|{{ obj.get('zz') }}|{{ obj.keys() | list }}"
                "|{{ obj.values() | list }}|{{ '12'.isdigit() }}|{{ 'ab'.isalpha() }}|{{ '{}-{}'.format(1, 'x') }}|{{ words.index('apple') }}"
                "|{{ 'xxhixx'.strip('x') }}|{{ '<think>a</think>b'.split('</think>')[-1] }}"),
    ("globals", "{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1, b=[2]) }}"
                " {{ namespace(x=1).x }} {{ strftime_now('%Y-%m-%d %H:%M %a %b') }} {{ bos_token }}{{ eos_token }}"),
    ("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}|{% generation %}gen{% endgeneration %}"),
    ("markup", "{{ '<b>' | safe + '<i>' }}|{{ '<b>' ~ ('<i>' | safe) }}|{{ ('<' | escape) + '>' }}"),
]


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(NOW, _dt.timezone.utc).replace(tzinfo=None)


def render(template, messages, agp, bos, eos, extra):
    kwargs = {}
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    tools = None
    for k, v in (extra or {}).items():
        if k == "tools":
            tools = v
        else:
            kwargs[k] = v
    # as apply_chat_template: keys whose value is None dropped, then render
    msgs = [{k: v for k, v in m.items() if v is not None} for m in messages]
    out, _ = ctu.render_jinja_template(conversations=[msgs], tools=tools, chat_template=template,
                                       add_generation_prompt=agp, **kwargs)
    return out[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="template names (without .jinja)")
    args = ap.parse_args()
    ctu.datetime = _FixedDatetime  # strftime_now's clock
    tdir = os.path.join(FIXTURES, "templates")
    odir = os.path.join(FIXTURES, "expected")
    os.makedirs(odir, exist_ok=True)
    total = 0
    for name in sorted(TOKENS):
        if args.only and name not in args.only:
            continue
        with open(os.path.join(tdir, name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        bos, eos = TOKENS[name]
        cases = []
        for cname, msgs, extra in CONVERSATIONS + EXTRA_CASES.get(name, []):
            for agp in (False, True):
                case = {"name": f"{cname}{'+gen' if agp else ''}", "messages": msgs, "add_generation_prompt": agp}
                if extra:
                    case["extra"] = extra
                try:
                    case["expected"] = render(template, msgs, agp, bos, eos, extra)
                except jinja2.exceptions.TemplateError as e:  # raise_exception, undefined values
                    case["error"] = str(e)
                except (TypeError, ValueError) as e:  # e.g. tojson of a generator
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
        doc = {"template": name + ".jinja", "bos_token": bos, "eos_token": eos, "now": NOW,
               "generator": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
               "cases": cases}
        with open(os.path.join(odir, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum("error" in c for c in cases)
        print(f"{name}: {len(cases)} cases ({n_err} refused by the template)")
        total += len(cases)
    if not args.only or "features" in args.only:
        cases = []
        for name, src in FEATURES:
            case = {"name": name, "source": src, "messages": [SYS, U1, A1, U2], "add_generation_prompt": False,
                    "extra": {k: v for k, v in FEATURE_VARS.items() if k not in ("bos_token", "eos_token")}}
            try:
                case["expected"] = render(src, case["messages"], False, FEATURE_VARS["bos_token"],
                                          FEATURE_VARS["eos_token"], case["extra"])
            except Exception as e:  # a feature case must render
                raise SystemExit(f"features/{name}: {type(e).__name__}: {e}")
            cases.append(case)
        doc = {"template": None, "bos_token": FEATURE_VARS["bos_token"], "eos_token": FEATURE_VARS["eos_token"],
               "now": NOW, "generator": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
               "cases": cases}
        with open(os.path.join(odir, "features.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"features: {len(cases)} cases")
        total += len(cases)
    print(f"{total} cases")


if __name__ == "__main__":
    sys.exit(main())

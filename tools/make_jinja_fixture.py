#!/usr/bin/env python3
"""Writes tests/fixtures/jinja_cases.json: small templates rendered by jinja2 exactly
as transformers renders chat templates (ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True and the loopcontrols extension; its tojson
filter, json.dumps(ensure_ascii=False, indent=...); raise_exception; strftime_now
at 2023-11-14 22:13:20 UTC), for tests/unit/test_jinja.cpp: each case's output,
or "error" when jinja2 refuses it. Constructs shardlm refuses on purpose (string
% formatting, case changes of non-ASCII text) are tested there by hand.

Usage: /work/venv/bin/python tools/make_jinja_fixture.py [--out tests/fixtures]
"""
import argparse
import datetime
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime.datetime.fromtimestamp(1700000000, datetime.timezone.utc)

VARIABLES = {"xs": [3, 1, 2], "d": {"b": 1, "a": [1, 2], "s": "str"}, "s": "  Hello, World  ", "n": None,
             "t": True, "f": 1.5, "e": "", "u8": "héllo wörld 猫",
             "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "yo", "reasoning_content": "think"}]}

CASES = [
    ("arithmetic", "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} "
                   "{{ 1.5 + 1 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ -f }} {{ 10 - 2 - 3 }}"),
    ("loop_variables", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
                       "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }}/"
                       "{{ loop.cycle('a', 'b') }};{% endfor %}"),
    ("for_else", "{% for x in [] %}a{% else %}empty{% endfor %}{% for x in xs %}{{ x }}{% else %}no{% endfor %}"),
    ("for_filter", "{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }}{% endfor %}"),
    ("for_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}"),
    ("for_over_dict_and_string", "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héj' %}{{ c }}.{% endfor %}"),
    ("for_reversed_messages", "{% for m in messages[::-1] %}{{ (messages|length - 1) - loop.index0 }}{{ m.role }} {% endfor %}"),
    ("namespace", "{% set ns = namespace(a=1, b='x') %}{% for x in xs %}{% set ns.a = ns.a + x %}{% endfor %}{{ ns.a }}{{ ns.b }}"),
    ("for_scope", "{% set y = 1 %}{% for x in xs %}{% set y = x %}{{ y }}{% endfor %}{{ y }}"),
    ("if_scope", "{% set y = 1 %}{% if true %}{% set y = 2 %}{% endif %}{{ y }}"),
    ("block_set", "{% set b %}inner {{ xs|length }}{% endset %}[{{ b }}]"),
    ("macro", "{% macro m(a, b='d') %}<{{ a }}|{{ b }}>{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(a=3, b=4) }}{{ m() }}"),
    ("macro_sees_globals", "{% set g = 'G' %}{% macro m() %}{{ g }}{{ xs|length }}{% endmacro %}{{ m() }}"),
    ("call_block", "{% macro w(x) %}({{ caller() }}{{ x }}){% endmacro %}{% call w(5) %}body{% endcall %}"),
    ("call_block_arguments", "{% macro w() %}({{ caller(7) }}){% endmacro %}{% call(v) w() %}got {{ v }}{% endcall %}"),
    ("slices", "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[0] }} {{ xs[-1] }} {{ 'abcdef'[1:4] }} {{ 'abc'[::-1] }} "
               "{{ u8[1:3] }} {{ u8[-1] }} {{ xs[5:] }} {{ xs[::2] }} {{ xs[-2::-1] }}"),
    ("membership", "{{ 1 in xs }} {{ 5 not in xs }} {{ 'ell' in s }} {{ 'b' in d }} {{ 'z' in d }} {{ 'tool_calls' in messages[2] }} "
                   "{{ 'reasoning_content' in messages[2] }}"),
    ("tests", "{{ n is none }} {{ n is not none }} {{ q is defined }} {{ q is undefined }} {{ s is string }} "
              "{{ xs is iterable }} {{ d is mapping }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} "
              "{{ t is true }} {{ t is false }} {{ f is float }} {{ 3 is integer }} {{ t is boolean }} {{ 1 is number }} "
              "{{ xs is sequence }} {{ 1 is eq 1 }} {{ 'a' is in 'abc' }} {{ n is sameas none }} {{ q is iterable }} "
              "{{ 3 is gt 2 }} {{ 'ab' is lower }} {{ m is callable }} {{ range is callable }}"),
    ("filters", "{{ s|trim }}|{{ s|length }}|{{ xs|length }}|{{ xs|count }}|{{ s|upper }}|{{ s|lower }}|{{ xs|join(',') }}|"
                "{{ xs|first }}|{{ xs|last }}|{{ q|default('dv') }}|{{ e|default('dv', true) }}|{{ e|d('x') }}|"
                "{{ d|items|list }}|{{ 'abc'|list }}|{{ 5|string }}|{{ '42'|int + 1 }}|{{ 'x'|int }}|{{ 2.7|int }}|"
                "{{ 'x y'|replace(' ', '_') }}|{{ s|safe }}|{{ 'hello world'|title }}|{{ 'hello'|capitalize }}|"
                "{{ '  a  '|trim('a ') }}|{{ -3|abs }}|{{ '1.5'|float }}"),
    ("tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ xs|tojson }}|{{ u8|tojson }}|"
               "{{ {'x': none, 'y': true, 'z': 1.5, 'w': 'q\"\\n\\t'}|tojson }}|{{ [] | tojson }}|{{ {} | tojson(indent=4) }}|"
               "{{ messages[2]|tojson(indent=4) }}|{{ 'a/b<c>&'|tojson }}"),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ s.split(',') }}|"
                       "{{ 'a b  c'.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|"
                       "{{ s.startswith('  He') }}|{{ s.endswith(('x','  ')) }}|{{ 'ab'.replace('a','c') }}|"
                       "{{ 'ab'.upper() }}|{{ 'AB'.lower() }}|{{ 'ab cd'.title() }}|{{ ' a b '.split(None, 1) }}|"
                       "{{ 'a b c'.rsplit(None, 1) }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'a</think>b'.split('</think>')[-1] }}|"
                       "{{ 'abcabc'.find('c') }}|{{ 'abcabc'.count('bc') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\\nb'.splitlines() }}"),
    ("dict_methods", "{{ d.get('b') }} {{ d.get('zz') }} {{ d.get('zz', 7) }} {{ d.keys()|list }} {{ d.values()|list }} "
                     "{{ d['a'][1] }} {{ d.a[0] }} {{ d.zz is defined }} {{ messages[0]['role'] }} {{ messages[1].content }}"),
    ("conditional_and_logic", "{{ 'y' if t else 'n' }} {{ 'y' if n else 'n' }} {{ 'y' if n }}|{{ t and 'A' }} {{ n or 'B' }} "
                              "{{ not t }} {{ not n and t }} {{ (1 if false else 2) + 1 }}"),
    ("break_continue", "{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
    ("comments", "a {# comment #} b {#- strip -#} c\n{# own line #}\nd"),
    ("trim_and_lstrip_blocks", "  {% if true %}\n    yes\n  {% endif %}\nend\n  {{ 'var' }}\n{% for x in xs %}\n{{ x }}\n{% endfor %}"),
    ("minus_whitespace_control", "line1\n    {%- if true -%}\n  x  \n{%- endif %}\n  {{- ' y ' -}}  \nz"),
    ("plus_whitespace_control", "{%+ if true %}x{% endif +%}\n  {% if true %}y{% endif %}\n  {%+ if true %}z{% endif %}"),
    ("elif_chain", "{% if true %}a{% elif false %}b{% else %}c{% endif %}{% if false %}a{% elif true %}b{% else %}c{% endif %}"
                   "{% if false %}a{% elif false %}b{% else %}c{% endif %}{% if false %}a{% endif %}"),
    ("raise_exception", "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"),
    ("strftime_now", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d') }}"),
    ("list_filters", "{{ xs|map('string')|join('-') }} {{ [d, d]|map(attribute='b')|list }} "
                     "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }} "
                     "{{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ xs|sort }} {{ xs|sort(reverse=true) }} "
                     "{{ xs|min }} {{ xs|max }} {{ xs|sum }} {{ [1,1,2]|unique|list }} {{ xs|reverse|list }} "
                     "{{ messages|map(attribute='role')|join(',') }} {{ ['b', 'a']|sort(case_sensitive=true) }}"),
    ("indent_range_dict", "{{ 'a\\nb'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ dict(a=1) }}"),
    ("printing", "{{ xs }} {{ d }} {{ n }} {{ t }} {{ f }} {{ 'it''s' }} {{ \"it's\" }} {{ 1e3 }} {{ 10 / 4 }} {{ 1.0 }} "
                 "{{ (1, 2) }} {{ (1,) }} {{ [1, [2, 'x']] }} {{ {'a': 1} }} {{ q }}|{{ 'a\\'b\"c' }} {{ ['a\\'b'] }}"),
    ("tuple_set", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (1, 2) %}{{ c[0] }}"),
    ("filter_block", "{% filter upper %}shout {{ 'it' }}{% endfilter %}"),
    ("nested_loops", "{% for a in xs %}{% for b in xs %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}"),
    ("missing_values", "{{ xs[5] }}|{{ d.zz }}|{{ q }}|{{ q|length }}|{{ messages[9] is defined }}|{{ messages[0].nope is defined }}"),
    ("comparisons", "{{ 3 > 2 }} {{ 2 >= 2 }} {{ 'a' < 'b' }} {{ [1,2] == [1,2] }} {{ 1 == 1.0 }} {{ true == 1 }} "
                    "{{ none == none }} {{ 'a' != 'b' }} {{ q == 'x' }} {{ d == {'b': 1, 'a': [1, 2], 's': 'str'} }}"),
    ("string_escapes", "{{ 'tab\\there' }}|{{ \"nl\\nx\" }}|{{ '\\u00e9\\x41' }}|{{ 'back\\\\slash' }}|{{ 'a' 'b' }}"),
    ("undefined_attribute_error", "{{ q.x }}"),
    ("undefined_call_error", "{{ nofunc(1) }}"),
    ("string_plus_int_error", "{{ 'a' + 1 }}"),
    ("none_iteration_error", "{% for x in n %}{% endfor %}"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    args = parser.parse_args()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    cases = []
    for name, source in CASES:
        case = {"name": name, "template": source}
        try:
            case["output"] = env.from_string(source).render(**VARIABLES)
        except Exception as e:  # noqa: BLE001 - any refusal is an expected error
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    fixture = {"generator": "tools/make_jinja_fixture.py", "reference": f"jinja2 {jinja2.__version__}",
               "strftime_now_unix_seconds": 1700000000, "variables": VARIABLES, "cases": cases}
    path = os.path.join(args.out, "jinja_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(cases)} cases, {sum('error' in c for c in cases)} refused")


if __name__ == "__main__":
    main()

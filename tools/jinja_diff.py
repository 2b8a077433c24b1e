#!/usr/bin/env python3
"""Differential check of kiln's Jinja engine against jinja2 (dev aid).

Usage: python3 tools/jinja_diff.py KILN_BINARY [N] [SEED]

Generates N random expression templates from a small grammar (literals,
operators, filters, tests, methods, subscripts over a fixed set of
variables), renders each with a local copy of transformers' chat-template
environment (gen_templates.py --local) and with `kiln template`, and prints
every case where the text differs or only one side fails. Not a test: the
committed expectations come from the oracle run; this finds candidates for
new cases in make_jinja_cases.py.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import gen_templates  # noqa: E402

VARS = {"x": [3, 1, 2], "s": "Hello World", "d": {"k": "v", "n": 2}, "e": "", "f": 2.5, "z": 0, "t": ["b", "A", "c"],
        "m": [{"role": "user", "content": "hi <b>"}, {"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "f", "arguments": {"a": 1}}}]}, {"role": "tool", "content": "{\"r\": 1}"}]}
ATOMS = ["0", "1", "2", "-3", "7", "0.5", "2.0", "-1.5", "'a'", "'Ab c'", "' x '", "''", "'é'", "none", "true",
         "false", "[1, 2]", "['a', 'B']", "{'a': 1}", "x", "s", "d", "e", "f", "z", "t", "u", "(1, 'a')", "[]", "{}",
         "m", "m[0]", "m[1].tool_calls", "m[-1].content", "m[0]['role']", "m[1].content", "m|length",
         "m|selectattr('role', 'equalto', 'user')|list", "m|map(attribute='role')|join(',')",
         "m[1].tool_calls[0].function.arguments", "m|rejectattr('content')|list", "m|last"]
BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "and", "or"]
FILTERS = ["length", "first", "last", "upper", "lower", "trim", "string", "int", "float", "abs", "round",
           "join(',')", "reverse|list", "sort|list", "unique|list", "tojson", "default('z')", "list", "items|list",
           "capitalize", "title", "wordcount", "replace('a', 'b')", "indent(2)", "center(7)", "sum", "min", "max",
           "select('odd')|list", "map('string')|list", "batch(2)|list", "dictsort", "d", "e", "safe", "count",
           "reject('even')|list", "selectattr('a')|list", "map(attribute='a')|list", "tojson(indent=1)",
           "round(1)", "int(5)", "float(1.5)", "truncate(5)", "format(1)", "trim('x')",
           "tojson(separators=(',', ':'))", "selectattr('role')|list", "map(attribute='role')|list",
           "groupby('role')|list", "sort(attribute='role')|list", "unique(attribute='role')|list"]
TESTS = ["defined", "undefined", "none", "string", "number", "odd", "even", "iterable", "mapping", "sequence",
         "integer", "float", "boolean", "true", "false", "lower", "upper", "divisibleby 2", "in [1, 'a']",
         "eq 1", "callable", "sameas none"]
METHODS = ["split()", "upper()", "strip()", "startswith('H')", "get('k')", "items()|list", "replace('o', '0')",
           "title()", "find('o')", "lower()", "split('o')", "count('l')", "endswith('d')", "keys()|list",
           "values()|list", "index(1)", "lstrip('H')", "capitalize()", "isdigit()", "zfill(4)", "rsplit(' ', 1)"]


def expr(r, depth=0):
    k = r.random()
    if depth > 2 or k < 0.3:
        return r.choice(ATOMS)
    if k < 0.5:
        return "%s %s %s" % (expr(r, depth + 1), r.choice(BINOPS), expr(r, depth + 1))
    if k < 0.65:
        return "(%s)|%s" % (expr(r, depth + 1), r.choice(FILTERS))
    if k < 0.72:
        return "%s is %s%s" % (expr(r, depth + 1), r.choice(["", "not "]), r.choice(TESTS))
    if k < 0.82:
        return "(%s).%s" % (r.choice(ATOMS), r.choice(METHODS))
    if k < 0.9:
        return "%s[%s]" % (r.choice(["x", "s", "t", "d", "e", "f", "z", "u"]),
                           r.choice(["0", "-1", "1:", "::-1", "'k'", "'a'", "5", ":2", "1:3"]))
    if k < 0.95:
        return "%s if %s else %s" % (expr(r, depth + 1), expr(r, depth + 1), expr(r, depth + 1))
    return "not %s" % expr(r, depth + 1)


def ws_text(r):
    return "".join(r.choice(["\n", "  ", "\t", "a", "b ", " \n ", "\r\n", "x\n  "]) for _ in range(r.randint(0, 4)))


def ws_block(r, depth=0):
    """Random whitespace-control soup: text, tags with -/+ modifiers, comments, raw, nested ifs/fors."""
    out = []
    for _ in range(r.randint(1, 4)):
        out.append(ws_text(r))
        k = r.random()
        o, c_ = r.choice(["", "-", "+"]), r.choice(["", "-", "+"])
        vo, vc = r.choice(["", "-"]), r.choice(["", "-"])
        if k < 0.25:
            out.append("{{%s 'v' %s}}" % (vo, vc))
        elif k < 0.4:
            out.append("{#%s c %s#}" % (r.choice(["", "-"]), r.choice(["", "-"])))
        elif k < 0.5:
            out.append("{%%%s raw %s%%}%s{{ x }}%s{%%%s endraw %s%%}" % (r.choice(["", "-"]), r.choice(["", "-"]), ws_text(r), ws_text(r), r.choice(["", "-"]), r.choice(["", "-"])))
        elif depth < 2:
            kw = r.choice(["if true", "for i in [1, 2]", "if false"])
            end = "endif" if kw.startswith("if") else "endfor"
            out.append("{%%%s %s %s%%}" % (o, kw, c_))
            out.append(ws_block(r, depth + 1))
            if kw.startswith("if") and r.random() < 0.4:
                out.append("{%%%s else %s%%}" % (r.choice(["", "-", "+"]), r.choice(["", "-", "+"])))
                out.append(ws_block(r, depth + 1))
            out.append(ws_text(r))
            out.append("{%%%s %s %s%%}" % (r.choice(["", "-", "+"]), end, r.choice(["", "-", "+"])))
    out.append(ws_text(r))
    return "".join(out)


def main():
    kiln = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    r = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    compile_, _, _ = gen_templates.local_env()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        msgs = os.path.join(tmp, "m.json")
        open(msgs, "w").write("[]")
        for i in range(n):
            k = r.random()
            if os.environ.get("JINJA_DIFF_WS"):
                src = ws_block(r)
            elif k < 0.6:
                src = "{{ %s }}" % expr(r)
            elif k < 0.75:
                src = "{%% for a in %s %%}{{ loop.index }}{{ a }}{{ loop.last }},{%% else %%}E{%% endfor %%}" % expr(r)
            elif k < 0.85:
                src = "{%% set v = %s %%}{{ v }}|{{ v|tojson }}" % expr(r)
            elif k < 0.95:
                src = "{%% if %s %%}y{%% elif %s %%}e{%% else %%}n{%% endif %%}" % (expr(r), expr(r))
            else:
                src = "{%% macro m(p, q=%s) %%}{{ p }}{{ q }}{%% endmacro %%}{{ m(%s) }}" % (expr(r), expr(r))
            try:
                want, werr = compile_(src).render(**VARS), None
            except Exception as e:  # noqa: BLE001
                want, werr = None, "%s: %s" % (type(e).__name__, e)
            if werr and ("RecursionError" in werr or "OverflowError" in werr or "Range too big" in werr):
                continue
            open(os.path.join(tmp, "chat_template.jinja"), "w").write(src)
            p = subprocess.run([kiln, "template", tmp, "--messages", msgs, "--kwargs", json.dumps(VARS)],
                               capture_output=True, timeout=20)
            got, gerr = (p.stdout.decode("utf-8", "replace"), None) if p.returncode == 0 else (None, p.stderr.decode())
            if (want is None) != (got is None) or (want is not None and want != got):
                bad += 1
                print("DIFF %s\n  jinja2: %r %s\n  kiln:   %r %s" % (src, want, werr or "", got, (gerr or "").strip()))
    print("%d cases, %d differ" % (n, bad))


if __name__ == "__main__":
    main()

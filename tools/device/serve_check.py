#!/usr/bin/env python3
"""serve_check.py — drive a running `kiln serve` over HTTP with the server
fixture's oracle cases (plain chat and completion prompts; greedy) and compare
the answers with what HF transformers generated for the same prompts.
Python's standard library only, so it runs on the GPU machine (no Node there).

Usage: serve_check.py BASE_URL FIXTURE_DIR     e.g. http://127.0.0.1:18080 tests/fixtures/server_chat
Exit 0 when every case matches."""
import json
import sys
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def main():
    base, fix = sys.argv[1], sys.argv[2]
    ref = json.load(open(f"{fix}/reference.json"))
    bad = 0
    for c in ref["cases"]:
        want = c.get("greedy_text_skip_special")
        if want is None or c.get("tools") or c.get("kwargs"):
            continue  # tool and template-kwargs cases are parsed into structured fields; the client tests cover them
        n = len(c["greedy_ids"]) + 2
        if c["kind"] == "chat":
            r = post(base + "/v1/chat/completions", {"messages": c["messages"], "max_tokens": n, "temperature": 0})
            got = r["choices"][0]["message"].get("content") or ""
            rc = r["choices"][0]["message"].get("reasoning_content")
            if rc:  # the server splits <think> blocks off; compare the text HF produced after it
                want = want.split("</think>")[-1].lstrip("\n")
        else:
            r = post(base + "/v1/completions", {"prompt": c["prompt_text"], "max_tokens": n, "temperature": 0})
            got = r["choices"][0]["text"]
        ok = got.strip() == want.strip()
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {c['name']:16s} got {got!r} want {want!r}")
    print("serve_check:", "all cases match" if not bad else f"{bad} case(s) differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

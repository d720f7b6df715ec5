"""Where llama.cpp's grammar engine and llama-cpp-python's schema converter break, measured in
child processes (a crash there is a row in the table, not the end of this script).

    python scripts/grammar_limits.py [--json out.json] [--quick]

Rows: GBNF nesting depth compiled on the main thread and on a worker thread (the server's case);
a string schema's maxLength through llama-cpp-python's converter and the compiler, and through
specgguf's (`chain`: constraints.converter, which writes it as a flat chain); an object's optional
property count through the converter; the cost of the grammar at run time for the largest
allowed string (a full-vocabulary `allowed()` scan after each of 200 accepted characters).
Prints a table and writes JSON; it asserts nothing (docs/structured-output.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import json, resource, sys, threading, time
from specgguf.runtime import native
from specgguf.runtime.defaults import default_target
kind, n, where = sys.argv[1], int(sys.argv[2]), sys.argv[3]
native.set_verbose(False)
model = native.Model(str(default_target()), vocab_only=True)
out = {}

def work():
    t0 = time.perf_counter()
    if kind == "nesting":
        gbnf = 'root ::= "\\"" ' + "(c " * n + ")" * n + ' "\\""\nc ::= [a-z]\n'
    elif kind == "maxLength":
        from llama_cpp.llama_grammar import json_schema_to_gbnf
        gbnf = json_schema_to_gbnf(json.dumps({"type": "string", "maxLength": n}))
    elif kind == "chain":  # specgguf's converter: maxLength as a flat chain of rules
        from specgguf.request.constraints import converter
        conv = converter()
        conv.visit({"type": "string", "maxLength": n}, "")
        gbnf = conv.format_grammar()
    elif kind == "properties":
        from llama_cpp.llama_grammar import json_schema_to_gbnf
        schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    out["convert_s"] = time.perf_counter() - t0
    out["gbnf_chars"] = len(gbnf)
    t0 = time.perf_counter()
    g = native.Grammar(model, gbnf)
    out["compile_s"] = time.perf_counter() - t0
    if kind in ("maxLength", "chain"):  # run time: accept characters one by one, scanning the vocabulary each time
        tok = model.tokenize('"', add_special=False, parse_special=False)[0]
        g.accept(tok)
        a = model.tokenize("a", add_special=False, parse_special=False)[0]
        t0 = time.perf_counter()
        steps = min(n, 100)
        for _ in range(steps):
            g.allowed()
            g.accept(a)
        out["scan_ms_per_token"] = (time.perf_counter() - t0) / steps * 1000
    g.close()

def guarded():
    try:
        work()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:160]

if where == "thread":
    t = threading.Thread(target=guarded); t.start(); t.join()
else:
    guarded()
out["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def run(kind: str, n: int, where: str, timeout: float = 120) -> dict:
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, kind, str(n), where], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"kind": kind, "n": n, "where": where, "outcome": f"timeout {timeout:.0f} s"}
    row = {"kind": kind, "n": n, "where": where, "wall_s": round(time.monotonic() - t0, 2)}
    if proc.returncode == 0:
        row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        row["outcome"] = "refused: " + row["error"] if "error" in row else "ok"
    elif proc.returncode < 0:
        row["outcome"] = f"killed by signal {-proc.returncode}"
    else:
        row["outcome"] = f"exit {proc.returncode}: " + (proc.stderr.strip().splitlines() or [""])[-1][:120]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    plan = [("nesting", n, w) for n in (1024, 8192, 16384, 18000, 20000, 65536) for w in ("main", "thread")]
    plan += [("maxLength", n, "thread") for n in (100, 1000, 1001, 4096, 20000)]
    plan += [("chain", n, "thread") for n in (1000, 4096, 16384, 65536)]
    plan += [("properties", n, "thread") for n in (128, 256, 512, 900, 1000)]
    if args.quick:
        plan = [p for p in plan if p[1] in (1024, 20000, 1000, 512)]
    rows = []
    print(f"{'kind':<11} {'n':>6} {'thread':<7} {'outcome':<28} {'convert s':>9} {'compile s':>9} "
          f"{'scan ms':>8} {'RSS MiB':>8}")
    for kind, n, where in plan:
        r = run(kind, n, where)
        rows.append(r)
        f = lambda k, fmt: format(r[k], fmt) if k in r else "-"  # noqa: E731
        print(f"{kind:<11} {n:>6} {where:<7} {r['outcome'][:28]:<28} {f('convert_s', '9.3f'):>9} "
              f"{f('compile_s', '9.3f'):>9} {f('scan_ms_per_token', '8.2f'):>8} {f('maxrss_mib', '8.0f'):>8}",
              flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()

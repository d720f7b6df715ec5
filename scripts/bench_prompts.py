"""The prompts the side-by-side benchmarks share (bench_side_by_side.py, bench_batch_invariant.py):
single text prompts for the embedded base model (PROMPTS; COPY_PROMPTS are the ones whose
answer copies from the prompt, TASKS the agentic loop's change requests, FUNCTION its file)
and chat requests for the instruct model (INSTRUCT: kind -> {item: user message})."""

from __future__ import annotations

import json

from specgguf.cli.options import DEMO_PROMPT

FUNCTION = '''def moving_average(values, window):
    """Return the moving averages of `values` over `window` items."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''
RECORDS = [{"id": i, "name": n, "role": r, "active": a, "tags": t} for i, (n, r, a, t) in enumerate([
    ("Ada", "engineer", True, ["compilers", "math"]), ("Grace", "admiral", True, ["cobol"]),
    ("Linus", "maintainer", False, ["kernel", "git"]), ("Barbara", "professor", True, ["clu", "types"]),
    ("Ken", "researcher", False, ["unix", "go"])], start=1)]
PROMPTS = {
    "readme-demo": DEMO_PROMPT,
    "copy-function": f"Copy this Python function exactly.\n\n{FUNCTION}\nCopy:\n",
    "edit-function": (f"Rename the variable `total` to `running` in this function and print the whole "
                      f"function.\n\n{FUNCTION}\nAnswer:\n"),
    "json-reformat": ("Reformat this JSON with an indent of 2 spaces, keys in the same order.\n\n"
                      f"{json.dumps(RECORDS)}\n\nReformatted:\n"),
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n",
}
COPY_PROMPTS = ("readme-demo", "copy-function", "edit-function", "json-reformat")
TASKS = ["Add a docstring line about the return value.", "Rename `window` to `size`.",
         "Add a type hint to every argument.", "Make it raise TypeError for non-list values.",
         "Add a comment above the loop.", "Rename the function to `rolling_mean`.",
         "Return a tuple instead of a list.", "Add an example to the docstring."]

# -- instruct requests (--instruct): chat messages for the instruct model ---------------------

MANUAL = """KETTLEWORKS K-200 SMART KETTLE - QUICK MANUAL (rev. 3)

1. Setup
Place the base on a dry, level surface at least 10 cm from the wall. Fill the kettle between
the MIN (0.5 L) and MAX (1.7 L) marks. Press and hold the power button for 2 seconds to pair
the kettle with the KettleWorks app.

2. Temperature presets
Green tea: 80 C. Oolong: 90 C. Black tea and coffee: 96 C. Boil: 100 C. The keep-warm mode
holds the chosen temperature for 30 minutes, then the kettle switches off.

3. Error codes
E1: the kettle is empty or below the MIN mark. Add water and press the power button again.
E2: the temperature sensor is disconnected. Unplug the base, wait 60 seconds and plug it in
again; if E2 returns, contact support.
E3: the kettle was lifted during heating. Put it back on the base within 10 seconds to resume.
E4: limescale is blocking the heating plate. Run the descaling program described in section 4.

4. Descaling
Mix 250 ml of white vinegar with 750 ml of water, pour it into the kettle and hold the minus
and plus buttons together for 5 seconds. The descaling program heats the mixture to 60 C,
waits 20 minutes and beeps three times when it is done. Rinse the kettle twice with clean
water before you use it again.

5. Warranty
The K-200 is covered for 24 months from the date of purchase. The warranty does not cover
damage from descaling with products other than vinegar or citric acid.
"""
LOG = """2024-05-14 09:12:01 INFO  api      started worker pool size=8
2024-05-14 09:12:03 INFO  api      GET /v1/orders/10482 200 12ms
2024-05-14 09:12:04 INFO  api      GET /v1/orders/10483 200 9ms
2024-05-14 09:12:07 WARN  db       slow query orders_by_customer 1840ms
2024-05-14 09:12:09 INFO  api      POST /v1/orders 201 48ms
2024-05-14 09:12:11 INFO  billing  charge ok order=10484 amount=87.40 EUR
2024-05-14 09:12:15 ERROR billing  charge failed order=10485 amount=129.00 EUR reason=card_expired
2024-05-14 09:12:15 INFO  api      POST /v1/orders 402 61ms
2024-05-14 09:12:18 INFO  api      GET /v1/orders/10484 200 11ms
2024-05-14 09:12:22 WARN  cache    eviction rate high 312/s
2024-05-14 09:12:25 INFO  billing  charge ok order=10486 amount=15.90 EUR
2024-05-14 09:12:30 ERROR api      GET /v1/customers/77 500 3012ms upstream timeout (crm)
2024-05-14 09:12:31 INFO  api      GET /v1/orders/10486 200 10ms
2024-05-14 09:12:36 INFO  api      worker pool resized size=12
"""
ORDER = {"order_id": "A-10482", "customer": "Maria Lopez", "email": "maria.lopez@example.com",
         "street": "14 Harbour Road", "city": "Porto", "zip": "4050-123", "country": "Portugal",
         "items": 3, "total_eur": 87.4, "status": "paid", "gift_wrap": False, "notes": "Leave at the front desk"}
PARSE_DURATION = '''def parse_duration(text):
    """Return the number of seconds in a duration such as '1h30m' or '45s'.

    Units: h (hours), m (minutes), s (seconds). Raises ValueError on anything else.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("duration must be a non-empty string")
    total = 0
    number = ""
    for ch in text.strip().lower():
        if ch.isdigit():
            number += ch
            continue
        if not number:
            raise ValueError(f"missing number before {ch!r}")
        if ch == "h":
            total += int(number) * 3600
        elif ch == "m":
            total += int(number) * 360
        elif ch == "s":
            total += int(number)
        else:
            raise ValueError(f"unknown unit {ch!r}")
        number = ""
    if number:
        raise ValueError("a number must end with a unit")
    return total
'''
TOP_WORDS = '''def top_words(text, n=10, min_length=1, stopwords=("the", "a", "an", "and", "of", "to")):
    """Return the n most frequent words of `text` as (word, count) pairs.

    Words are lower-cased and stripped of punctuation; stopwords and words
    shorter than min_length are skipped. Ties are broken alphabetically.
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    if min_length < 1:
        raise ValueError("min_length must be at least 1")
    counts = {}
    for raw in text.split():
        word = raw.strip(".,;:!?\\"'()[]").lower()
        if not word or word in stopwords:
            continue
        if len(word) < min_length:
            continue
        counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]))
    result = []
    for word, count in ranked[:n]:
        result.append((word, count))
    return result
'''
MERGE_INTERVALS = '''def merge_intervals(intervals):
    """Merge overlapping or touching [start, end] intervals.

    Returns a new list of [start, end] lists sorted by start; the input is
    left unchanged. Raises ValueError for an interval that ends before it starts.
    """
    checked = []
    for item in intervals:
        if len(item) != 2:
            raise ValueError(f"an interval has two ends, got {item!r}")
        start, end = item
        if start > end:
            raise ValueError(f"interval [{start}, {end}] ends before it starts")
        checked.append((start, end))
    checked.sort()
    merged = []
    for start, end in checked:
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
'''


# the instruction first, the material after it: so asked, the 135M model answers and stops;
# asked after the material it more often drifts into a repeating tail (which any lookup drafts)
def _qa(title: str, document: str, question: str) -> str:
    return (f"Read this {title.lower()} and answer the question by quoting it.\n\n{title}:\n{document}\n"
            f"Question: {question}")


def _rewrite(change: str) -> str:
    return (f"{change} in this JSON record and output the whole record, every field, as JSON.\n\n"
            f"{json.dumps(ORDER, indent=2)}")


def _fix(function: str, bug: str) -> str:
    return f"Fix the bug in this Python function: {bug} Write the whole fixed function.\n\n```python\n{function}```"


# kind -> {item: user message}; no system message (the template's own default, as an app sends it)
INSTRUCT = {
    "document QA": {
        "manual-e2": _qa("Manual", MANUAL, "What does error code E2 mean and what should I do?"),
        "manual-descale": _qa("Manual", MANUAL, "How do I descale the kettle?"),
        "log-failure": _qa("Log", LOG, "Which charge failed and why?"),
    },
    "JSON rewrite": {
        "set-status": _rewrite('Change "status" to "shipped"'),
        "rename-zip": _rewrite('Rename the field "zip" to "postal_code", keeping its value,'),
        "set-gift-wrap": _rewrite('Set "gift_wrap" to true'),
    },
    "bug fix": {
        "parse-duration": _fix(PARSE_DURATION, "minutes are counted as 360 seconds instead of 60."),
        "top-words": _fix(TOP_WORDS, "it returns the least frequent words instead of the most frequent."),
        "merge-intervals": _fix(MERGE_INTERVALS, "touching intervals such as [1, 3] and [3, 5] are not merged."),
    },
}

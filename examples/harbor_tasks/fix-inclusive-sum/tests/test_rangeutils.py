"""Tests for /app/rangeutils.py (stdlib only); prints each failing case."""

import random
import sys

sys.path.insert(0, "/app")
try:
    import rangeutils
except Exception as e:  # a syntax error, a missing file
    print(f"FAIL: /app/rangeutils.py does not import: {type(e).__name__}: {e}")
    sys.exit(1)

fails = []
for name in ("range_sum", "range_len"):
    if not callable(getattr(rangeutils, name, None)):
        fails.append(f"rangeutils.{name} is missing")
if fails:
    print("FAIL:", "; ".join(fails))
    sys.exit(1)

cases = [(1, 3), (5, 5), (1, 10), (0, 0), (-3, 3), (-5, -2), (4, 2), (10, 1), (0, 100)]
rng = random.Random(7)
cases += [(rng.randint(-50, 50), rng.randint(-50, 50)) for _ in range(30)]
for a, b in cases:
    want = sum(range(a, b + 1))
    try:
        got = rangeutils.range_sum(a, b)
    except Exception as e:
        fails.append(f"range_sum({a}, {b}) raised {type(e).__name__}: {e}")
        continue
    if got != want:
        fails.append(f"range_sum({a}, {b}) returned {got!r}, expected {want}")
for a, b in [(1, 3), (5, 5), (4, 2), (-2, 2)]:
    if rangeutils.range_len(a, b) != max(0, b - a + 1):
        fails.append(f"range_len({a}, {b}) is wrong now; range_len was correct and should not change")
if fails:
    print(f"FAIL: {len(fails)} of {len(cases) + 4} checks failed, e.g.:")
    for f in fails[:5]:
        print(" -", f)
    sys.exit(1)
print(f"PASS: range_sum is right on all {len(cases)} inputs")

"""Tests for /app/pagination.py (stdlib only); prints each failing case."""

import random
import sys

sys.path.insert(0, "/app")
try:
    import pagination
except Exception as e:
    print(f"FAIL: /app/pagination.py does not import: {type(e).__name__}: {e}")
    sys.exit(1)
if not callable(getattr(pagination, "page_count", None)) or not callable(getattr(pagination, "page_slice", None)):
    print("FAIL: pagination must still define page_count(total_items, per_page) and page_slice(page, per_page)")
    sys.exit(1)

cases = [
    (25, 10),
    (20, 10),
    (0, 10),
    (1, 10),
    (9, 10),
    (10, 10),
    (11, 10),
    (1, 1),
    (7, 1),
    (100, 7),
    (5, 100),
    (10**20, 3),
    (10**20 + 1, 10**10),
    (3 * 10**18, 10**18),
]
rng = random.Random(5)
cases += [(rng.randint(0, 1000), rng.randint(1, 50)) for _ in range(100)]
fails = []
for n, k in cases:
    want = -(-n // k)
    try:
        got = pagination.page_count(n, k)
    except Exception as e:
        fails.append(f"page_count({n}, {k}) raised {type(e).__name__}: {e}")
        continue
    if got != want or not isinstance(got, int):
        fails.append(f"page_count({n}, {k}) returned {got!r}, expected {want}")
for k in (0, -3):
    try:
        pagination.page_count(10, k)
        fails.append(f"page_count(10, {k}) did not raise ValueError")
    except ValueError:
        pass
    except Exception as e:
        fails.append(f"page_count(10, {k}) raised {type(e).__name__}, expected ValueError")
if pagination.page_slice(3, 10) != (20, 30):
    fails.append("page_slice(3, 10) is wrong now; page_slice was correct and should not change")
if fails:
    print(f"FAIL: {len(fails)} check(s) failed, e.g.:")
    for f in fails[:5]:
        print(" -", f)
    sys.exit(1)
print(f"PASS: page_count is right on all {len(cases)} inputs")

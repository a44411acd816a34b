"""Tests for /app/search.py (stdlib only); prints each failing case."""

import random
import sys

sys.path.insert(0, "/app")
try:
    import search
except Exception as e:
    print(f"FAIL: /app/search.py does not import: {type(e).__name__}: {e}")
    sys.exit(1)
if not callable(getattr(search, "binary_search", None)) or not callable(getattr(search, "contains", None)):
    print("FAIL: search must still define binary_search(items, target) and contains(items, target)")
    sys.exit(1)


class Counting:
    """A sorted sequence (len and indexing only) that counts item reads, to tell a binary search
    from a linear scan."""

    reads = 0

    def __init__(self, data):
        self.data = list(data)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        Counting.reads += 1
        return self.data[i]


fails = []
cases = [
    ([], 3),
    ([5], 5),
    ([5], 4),
    ([5], 6),
    ([1, 3], 1),
    ([1, 3], 3),
    ([1, 3], 2),
    ([1, 2, 3, 4, 5], 5),
    ([1, 2, 3, 4, 5], 1),
    ([1, 2, 3, 4, 5], 0),
    ([1, 2, 3, 4, 5], 6),
    ([-10, -3, 0, 7, 42, 99], 99),
    ([-10, -3, 0, 7, 42, 99], -10),
    ([-10, -3, 0, 7, 42, 99], 8),
]
rng = random.Random(11)
for _ in range(200):
    items = sorted(rng.sample(range(-100, 100), rng.randint(0, 30)))
    cases.append((items, rng.randint(-105, 105)))
    if items:
        cases.append((items, rng.choice(items)))
for items, target in cases:
    try:
        got = search.binary_search(list(items), target)
    except Exception as e:
        fails.append(f"binary_search({items}, {target}) raised {type(e).__name__}: {e}")
        continue
    if target in items:
        ok = isinstance(got, int) and 0 <= got < len(items) and items[got] == target
        if not ok:
            fails.append(f"binary_search({items}, {target}) returned {got!r}, but {target} is in the list")
    elif got != -1:
        fails.append(f"binary_search({items}, {target}) returned {got!r}; {target} is not in the list, expected -1")
    if len(fails) >= 20:
        break
if not fails:
    big = Counting(range(0, 200000, 2))
    for t in (0, 199998, 100000, 7):
        Counting.reads = 0
        try:
            search.binary_search(big, t)
        except Exception as e:
            fails.append(
                f"binary_search on a sorted sequence that supports only len() and indexing raised "
                f"{type(e).__name__}: {e}; a binary search needs nothing else"
            )
            break
        if Counting.reads > 200:
            fails.append(
                f"binary_search read {Counting.reads} items of a 100000-item list: it must stay a binary search"
            )
            break
    if search.contains([1, 2, 3], 3) is not True or search.contains([1, 2, 3], 4) is not False:
        fails.append("contains() gives wrong answers")
if fails:
    print(f"FAIL: {len(fails)}{' or more' if len(fails) >= 20 else ''} check(s) failed, e.g.:")
    for f in fails[:5]:
        print(" -", f)
    sys.exit(1)
print(f"PASS: binary_search is right on all {len(cases)} inputs and stays logarithmic")

"""Tests for /app/calendar_utils.py (stdlib only); prints each failing case."""

import calendar
import sys

sys.path.insert(0, "/app")
try:
    import calendar_utils as cu
except Exception as e:
    print(f"FAIL: /app/calendar_utils.py does not import: {type(e).__name__}: {e}")
    sys.exit(1)
if not callable(getattr(cu, "is_leap", None)) or not callable(getattr(cu, "days_in_year", None)):
    print("FAIL: calendar_utils must still define is_leap(year) and days_in_year(year)")
    sys.exit(1)

years = [1, 4, 100, 400, 1600, 1700, 1800, 1900, 1996, 1999, 2000, 2004, 2023, 2024, 2100, 2400, 2800, 2900]
years += list(range(1890, 2110, 7))
fails = []
for y in years:
    want = calendar.isleap(y)
    try:
        got = cu.is_leap(y)
    except Exception as e:
        fails.append(f"is_leap({y}) raised {type(e).__name__}: {e}")
        continue
    if bool(got) != want or not isinstance(got, bool):
        fails.append(f"is_leap({y}) returned {got!r}, expected {want}")
for y in (1900, 2000, 2023, 2024):
    try:
        d = cu.days_in_year(y)
    except Exception as e:
        fails.append(f"days_in_year({y}) raised {type(e).__name__}: {e}")
        continue
    if d != (366 if calendar.isleap(y) else 365):
        fails.append(f"days_in_year({y}) returned {d!r}")
if fails:
    print(f"FAIL: {len(fails)} check(s) failed, e.g.:")
    for f in fails[:5]:
        print(" -", f)
    sys.exit(1)
print(f"PASS: is_leap is right on all {len(years)} years")

#!/bin/bash
# Verifier for csv-column-sum: /app/north_total.txt must hold the north amounts' sum, with two decimals.
mkdir -p /logs/verifier
python3 - <<'PY'
import re, sys
from decimal import Decimal

OUT = "/app/north_total.txt"
EXPECTED = Decimal("1997.74")
WITH_NORTHEAST = Decimal("5362.37")  # north + northeast: a substring match
try:
    text = open(OUT, encoding="utf-8", errors="replace").read()
except FileNotFoundError:
    print(f"FAIL: {OUT} does not exist; write the total there"); sys.exit(1)
lines = [l.strip() for l in text.splitlines() if l.strip()]
if not lines:
    print(f"FAIL: {OUT} is empty"); sys.exit(1)
if len(lines) > 1:
    print(f"FAIL: {OUT} has {len(lines)} non-empty lines; write only the total"); sys.exit(1)
got = lines[0]
try:
    value = Decimal(got)
    assert value.is_finite()
except Exception:
    print(f"FAIL: {OUT} holds {got!r}, which is not a number"); sys.exit(1)
if abs(value - EXPECTED) < Decimal("0.005"):
    if not re.fullmatch(r"-?\d+\.\d{2}", got):
        print(f"FAIL: the value is right but {got!r} is not written with exactly two digits after the decimal point "
              "(e.g. 1234.50)"); sys.exit(1)
    print("PASS: the north total is right and formatted with two decimals"); sys.exit(0)
if value == WITH_NORTHEAST:
    print(f"FAIL: {got} also counts the 'northeast' rows; match the region column exactly, not as a substring")
elif value == 0:
    print(f"FAIL: {got} is zero; no north rows were summed (is the region the 2nd column and amount the 4th?)")
else:
    print(f"FAIL: {got} is not the sum of the amount column (4th) over rows whose region (2nd column) is exactly 'north'")
sys.exit(1)
PY
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; exit 0; fi
echo 0 > /logs/verifier/reward.txt
exit 1

#!/bin/bash
cat > /app/tally.py <<'PY'
import sys
from collections import defaultdict

totals = defaultdict(int)
with open(sys.argv[1]) as f:
    for line in f:
        if line.strip():
            name, amount = line.split()
            totals[name] += int(amount)
for name in sorted(totals):
    print(name, totals[name])
PY

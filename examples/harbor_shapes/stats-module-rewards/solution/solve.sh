#!/bin/bash
cat > /app/stats.py <<'PY'
def mean(xs):
    """The arithmetic mean of a non-empty list of numbers."""
    return sum(xs) / len(xs)


def median(xs):
    """The median of a non-empty list of numbers; the list is not changed."""
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
PY

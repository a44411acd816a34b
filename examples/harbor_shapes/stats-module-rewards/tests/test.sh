#!/bin/bash
# Writes /logs/verifier/reward.json with three keys: reward (all checks), correctness, docs.
mkdir -p /logs/verifier
cd /app
python3 -B - <<'PY'
import importlib.util, inspect, json
correctness = docs = 0.0
notes = []
try:
    spec = importlib.util.spec_from_file_location("stats", "/app/stats.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    xs = [5, 1, 4, 2]
    cases = [(m.mean([1, 2, 3, 4]), 2.5), (m.median(xs), 3.0), (m.median([7, 1, 3]), 3), (m.mean([10]), 10)]
    correctness = float(all(abs(got - want) < 1e-9 for got, want in cases) and xs == [5, 1, 4, 2])
    if not correctness:
        notes.append("mean or median gives a wrong value (or median changed its list)")
    docs = float(all(inspect.getdoc(f) for f in (m.mean, m.median)))
    if not docs:
        notes.append("mean and median need docstrings")
except Exception as e:  # no module, a syntax error, a missing function
    notes.append(f"/app/stats.py cannot be used: {type(e).__name__}: {e}")
reward = float(correctness == 1.0 and docs == 1.0)
json.dump({"reward": reward, "correctness": correctness, "docs": docs}, open("/logs/verifier/reward.json", "w"))
print("PASS" if reward else "FAIL: " + "; ".join(notes))
PY

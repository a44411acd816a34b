#!/bin/bash
# Verifier for csv-to-json: /app/people.json must be right, and /app/csv2json.py must also convert a CSV it never saw.
mkdir -p /logs/verifier
cd /app
python3 -B - <<'PY'
import csv, json, os, subprocess, sys, tempfile

def expected(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))

def compare(what, got, want):
    if not isinstance(got, list):
        return f"{what} holds a JSON {type(got).__name__}, not an array of objects"
    if len(got) != len(want):
        return f"{what} has {len(got)} objects; the CSV has {len(want)} data rows (the header row is not data)"
    for i, (g, w) in enumerate(zip(got, want), 1):
        if not isinstance(g, dict):
            return f"item {i} of {what} is a JSON {type(g).__name__}, not an object"
        if set(g) != set(w):
            return f"object {i} of {what} has keys {sorted(g)}; the keys must be the CSV header's names"
        for k in w:
            if g[k] != w[k]:
                return (f"object {i} of {what}: {k!r} is {g[k]!r}, which is not the CSV field as text "
                        "(keep values as strings, handle quoted fields)")
    return None

problems = []
script = "/app/csv2json.py"
if not os.path.isfile(script):
    print(f"FAIL: {script} does not exist; write the converter there"); sys.exit(1)
try:
    with open("/app/people.json", encoding="utf-8") as f:
        why = compare("/app/people.json", json.load(f), expected("/app/people.csv"))
    if why:
        problems.append(why)
except FileNotFoundError:
    problems.append("/app/people.json does not exist; run the script on /app/people.csv")
except (json.JSONDecodeError, UnicodeDecodeError) as e:
    problems.append(f"/app/people.json is not valid UTF-8 JSON: {e}")

out = os.path.join(tempfile.mkdtemp(), "extra.json")
try:
    r = subprocess.run([sys.executable, script, "/tests/extra.csv", out], capture_output=True, text=True, timeout=10)
except subprocess.TimeoutExpired:
    problems.append("python3 /app/csv2json.py IN OUT did not finish within 10 s")
else:
    if r.returncode != 0:
        problems.append(f"python3 /app/csv2json.py IN.csv OUT.json on another CSV exited {r.returncode}: "
                        f"{(r.stderr or r.stdout).strip()[-300:]}")
    elif not os.path.isfile(out):
        problems.append("python3 /app/csv2json.py IN.csv OUT.json wrote nothing at OUT.json (take both paths from the command line)")
    else:
        try:
            with open(out, encoding="utf-8") as f:
                why = compare("the JSON written for another CSV (with quoted fields)", json.load(f), expected("/tests/extra.csv"))
            if why:
                problems.append(why)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            problems.append(f"the script's output for another CSV is not valid JSON: {e}")
if problems:
    print("FAIL:")
    for p in problems:
        print(" -", p)
    sys.exit(1)
print("PASS: people.json is right and the script converts other CSV files too")
PY
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; exit 0; fi
echo 0 > /logs/verifier/reward.txt
exit 1

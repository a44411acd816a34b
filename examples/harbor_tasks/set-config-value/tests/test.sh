#!/bin/bash
# Verifier for set-config-value: /app/config/app.conf must equal the original with only the port line changed.
mkdir -p /logs/verifier
python3 - <<'PY'
import sys

CONF = "/app/config/app.conf"
try:
    got = open(CONF, encoding="utf-8", errors="replace").read()
except FileNotFoundError:
    print(f"FAIL: {CONF} is missing (edit it in place, do not delete it)"); sys.exit(1)
want = open("/tests/expected.conf", encoding="utf-8").read()
if got == want:
    print("PASS: port is 9090 and every other line is unchanged"); sys.exit(0)
g, w = got.splitlines(), want.splitlines()
problems = []
if "port = 9090" not in g:
    if "port = 8080" in g:
        problems.append("the line 'port = 8080' is still there: the port setting was not changed")
    else:
        problems.append("there is no line reading exactly 'port = 9090'")
for i, (a, b) in enumerate(zip(g, w), 1):
    if a != b and b != "port = 9090":
        problems.append(f"line {i} was changed to {a!r}; only the 'port' line may change")
if len(g) != len(w):
    problems.append(f"the file has {len(g)} lines; it should keep its {len(w)} lines (no lines added or removed)")
if not problems and got.rstrip("\n") == want.rstrip("\n"):
    problems.append("the lines are right but the file's final newline changed")
if not problems:
    problems.append("the file differs from the original in more than the port line (whitespace?)")
print(f"FAIL: {CONF} is not as expected:")
for p in problems[:8]:
    print(" -", p)
sys.exit(1)
PY
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; exit 0; fi
echo 0 > /logs/verifier/reward.txt
exit 1

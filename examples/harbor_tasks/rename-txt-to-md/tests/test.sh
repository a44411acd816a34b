#!/bin/bash
# Verifier for rename-txt-to-md: the exact set of names in /app/reports and each file's contents.
mkdir -p /logs/verifier
python3 - <<'PY'
import os, sys

D = "/app/reports"
# name -> the original contents
want = {
    "q1.md": "Q1 revenue was up 4%.\n",
    "q2.md": "Q2 revenue was flat.\n",
    "annual summary.md": "Summary of the year: steady growth.\n",
    "data.csv": "region,total\nnorth,10\nsouth,12\n",
    "q1.txt.bak": "old backup of q1, keep as is\n",
    "README": "Notes about the .txt files in this folder.\n",
}
if not os.path.isdir(D):
    print(f"FAIL: {D} is missing"); sys.exit(1)
have = set(os.listdir(D))
problems = []
left = sorted(n for n in have if n.endswith(".txt"))
if left:
    problems.append(f"files still ending in .txt: {left}")
for n in sorted(have - set(want)):
    if not n.endswith(".txt"):
        problems.append(f"unexpected file {n!r} in {D} (only names ending in .txt should change, and only their extension)")
for n, text in want.items():
    if n not in have:
        if n.endswith(".md"):
            problems.append(f"{n!r} is missing: each X.txt should become X.md with the rest of the name unchanged")
        else:
            problems.append(f"{n!r} is missing: it does not end in .txt, so it should have been left alone")
        continue
    with open(os.path.join(D, n), "rb") as f:
        if f.read() != text.encode():
            problems.append(f"the contents of {n!r} changed; renaming must keep contents")
if problems:
    print("FAIL: /app/reports is not as expected:")
    for p in problems:
        print(" -", p)
    sys.exit(1)
print("PASS: all .txt files renamed to .md, everything else untouched")
PY
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; exit 0; fi
echo 0 > /logs/verifier/reward.txt
exit 1

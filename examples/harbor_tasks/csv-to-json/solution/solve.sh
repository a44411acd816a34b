#!/bin/bash
cat > /app/csv2json.py <<'PY'
import csv, json, sys
with open(sys.argv[1], newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
with open(sys.argv[2], "w", encoding="utf-8") as f:
    json.dump(rows, f, ensure_ascii=False, indent=2)
PY
python3 /app/csv2json.py /app/people.csv /app/people.json

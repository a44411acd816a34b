#!/bin/bash
python3 -c 'import csv; print("%.2f" % sum(float(r["amount"]) for r in csv.DictReader(open("/app/sales.csv")) if r["region"] == "north"))' > /app/north_total.txt

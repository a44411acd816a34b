#!/bin/bash
     # The data came from two heredoc RUNs (a bare one, and python3 reading one).
     mkdir -p /logs/verifier
     problem=""
     want=$(python3 -c "import csv; print(sum(int(r['qty']) for r in csv.DictReader(open('/app/inventory.csv'))))")
     if [ "$want" != 545 ]; then problem="the image's /app/inventory.csv is not the one built (total $want)"
     elif [ ! -f /app/total.txt ]; then problem="/app/total.txt does not exist"
     elif [ "$(tr -d '[:space:]' < /app/total.txt)" != "$want" ]; then problem="/app/total.txt does not hold the total quantity"
     fi

if [ -z "$problem" ]; then echo "PASS"; echo 1 > /logs/verifier/reward.txt; else echo "FAIL: $problem"; echo 0 > /logs/verifier/reward.txt; fi

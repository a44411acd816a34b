#!/bin/bash
cd /app
python3 tally.py sales.txt > report.txt
python3 -c 'import sys; print("TOTAL", sum(int(l.split()[1]) for l in open("sales.txt") if l.strip()))' >> report.txt

#!/bin/bash
tail -n +2 /app/inventory.csv | cut -d, -f2 | paste -sd+ | python3 -c "print(eval(input()))" > /app/total.txt

#!/bin/bash
sed -i 's/range(a, b):/range(a, b + 1):/' /app/rangeutils.py

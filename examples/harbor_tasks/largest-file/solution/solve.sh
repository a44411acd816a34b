#!/bin/bash
find /app/data -type f -printf '%s %f\n' | sort -n | tail -1 | cut -d' ' -f2- > /app/largest.txt

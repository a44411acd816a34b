#!/bin/bash
sed -i 's/while lo < hi:/while lo <= hi:/' /app/search.py

#!/bin/bash
mkdir -p /app/project/{src,tests,docs/api}
touch /app/project/src/__init__.py
cp /app/template/README.md /app/project/README.md

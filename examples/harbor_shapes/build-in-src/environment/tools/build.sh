#!/bin/bash
# Builds the project in the current directory, in $BUILD_MODE.
set -e
if [ ! -f project.conf ]; then echo "build.sh: run me from the project folder (no project.conf in $PWD)" >&2; exit 2; fi
if [ -z "$BUILD_MODE" ]; then echo "build.sh: BUILD_MODE is not set" >&2; exit 2; fi
mkdir -p dist
echo "$(grep '^name=' project.conf | cut -d= -f2) built in $BUILD_MODE mode from $PWD" > dist/app.txt
cp dist/app.txt /tmp/build-stamp
echo "built dist/app.txt"

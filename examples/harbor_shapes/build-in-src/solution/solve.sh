#!/bin/bash
cd /app/src
export BUILD_MODE=release
/app/tools/build.sh

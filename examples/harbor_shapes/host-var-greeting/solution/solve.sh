#!/bin/bash
# SOLUTION_GREETING comes from [solution] env
echo "$SOLUTION_GREETING, $GREETING_NAME" > /app/hello.txt

#!/bin/bash
greet harbor > /app/greeting.txt

#!/bin/bash
sed -i 's/year % 400 != 0/year % 400 == 0/' /app/calendar_utils.py

"""Sandbox (issue: a real security boundary for model-written code; process and docker backends). Not built yet; nothing in evolvekit runs model-written code until it exists."""

"""Prompt layer (issue: evolutionary and reflective prompt search, DSPy interop). Not built yet."""

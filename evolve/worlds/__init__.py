"""Worlds: self-contained task environments that ship with evolvekit (the offline defaults)."""

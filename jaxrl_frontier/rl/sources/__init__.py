"""Stage 1, prompt sources: which prompts each step trains on (`data.source`).

Importing the package registers every built-in source in `SOURCES`.
"""

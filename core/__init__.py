"""tunedeck's headless engine. Nothing under core/ imports textual (checked by import-linter)."""

"""tunedeck's front ends: the Textual TUI and the command line."""

"""The `tuneforge` command line (Typer + Rich)."""

"""Pure domain types: no I/O, imports nothing else of tuneforge."""

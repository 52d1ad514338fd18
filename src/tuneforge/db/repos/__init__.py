"""Repositories: one module per entity; the only code that queries tables."""

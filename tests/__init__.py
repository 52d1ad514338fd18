"""tuneforge's test suite (a package so that `tests.helpers` can be imported)."""

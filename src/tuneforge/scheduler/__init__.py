"""Scheduler: validation of new jobs, attempt reconciliation, admission."""

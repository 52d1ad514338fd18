"""Tenants: their API keys, quotas, metered usage and sealed secrets."""

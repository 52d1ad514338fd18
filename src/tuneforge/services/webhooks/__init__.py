"""Webhooks: a tenant's endpoints and their signing secrets (`subscriptions`), delivery with retries (`delivery`)."""

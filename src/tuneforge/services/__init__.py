"""Use cases called by the API routes, the CLI and the scheduler."""

"""Training jobs as a tenant sees them: create, validate, plan, queue, evaluate, report, export; sweeps."""

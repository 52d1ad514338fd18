"""The model registry: fine-tuned models with their lineage, eval results and
gates, stages (dev → staging → production → archived), deprecation with a
grace period, and exports (merged weights)."""

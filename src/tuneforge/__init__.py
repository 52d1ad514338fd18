"""tuneforge: a self-hosted, multi-tenant, OpenAI-compatible fine-tuning platform."""

__version__ = "0.1.0"

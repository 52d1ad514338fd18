"""HTTP API: OpenAI-compatible /v1 plus tuneforge's extensions."""

from tuneforge.api.app import create_app

__all__ = ["create_app"]

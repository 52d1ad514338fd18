"""Inference for base and fine-tuned models: adapters hot-swapped on one loaded base.

The platform's `InferenceEngine` (`serve/engine.py`) is created on the first
request that needs it (`services.context.Platform.inference_engine`): torch and
transformers are imported then, never when the API starts.
"""

"""Models as the trainer and the serving engine both use them: loading a base, naming its modules.

Below `train/` and `serve/` (neither imports the other), above `storage/`.
"""

"""Training data: JSONL reading, upload validation, tokenization with loss masks."""

"""What the platform serves: base models and the traffic routes between fine-tuned models."""

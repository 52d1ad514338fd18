"""A self-contained demo: a tiny random Llama, a memorization task, its scorer.

`tiny_model.build_tiny_model` writes the base model, `dataset` writes the
training and validation files and holds the recommended job settings, and
`evaluate.mapping_accuracy` scores a model on the task.
"""

"""Graders: OpenAI's grader types, scored here (reinforcement fine-tuning and `graders/run`).

The shapes are `domain/graders.py`; this package scores them: `templates`
(`{{item.x}}`, `{{sample.output_text}}` ...), `similarity` (text metrics),
`formula` (the `multi` grader's `calculate_output`, parsed, never `eval`ed),
`sandbox` (tenant python, run only inside bubblewrap) and `score` (one grader
on one sample, with OpenAI's result and error flags).
"""

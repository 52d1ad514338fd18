"""Every code a dataset check can report, with what it means.

The codes are an API: clients branch on them, docs link to them, and tests
assert them. Add codes; never rename or reuse one. `tests/unit/data` checks
that every code raised anywhere in `tuneforge.data` is listed here.

`line` in a report is 1-based: the JSONL line, the physical line where a CSV
record starts (the header is line 1), or the Parquet/Arrow row + 1. Line 0
means the whole file.
"""

from __future__ import annotations

# Reading the file: format, encoding, compression, archives (formats, archives, columnar).
FILE_CODES: dict[str, str] = {
    "empty_file": "The file holds no rows: empty, only blank lines, a CSV header alone, or a table with 0 rows.",
    "binary_file": "A text format (JSONL, CSV) holds binary data (NUL or control bytes).",
    "unsupported_format": "The format cannot be recognised or is not supported (e.g. gzip-compressed Parquet).",
    "invalid_encoding": "Text that is not UTF-8 (UTF-16, latin-1, ...). Reported on the line where it occurs.",
    "line_too_long": "One line is longer than the reader's `max_line_bytes` limit.",
    "compression_bomb": "Decompressing the file goes past `max_decompressed_bytes` or `max_compression_ratio`.",
    "invalid_compression": "A gzip stream that is corrupt or truncated.",
    "invalid_parquet": "Not a readable Parquet file (truncated, corrupt footer or pages).",
    "invalid_arrow": "A saved dataset's Arrow shard cannot be read.",
    "invalid_schema": "The table or CSV header has no usable column, or duplicate/empty column names.",
    "invalid_hf_dataset": "A saved Hugging Face dataset directory without a readable state.json and data files.",
    "invalid_archive": "An archive that cannot be read, has too many members, or holds no saved dataset.",
    "unsafe_archive": "An archive member with an absolute path, '..', a link or a device file.",
    "csv_syntax": "A CSV record with a quoting error, or with a different number of cells than the header.",
    "invalid_json": "Text that is not valid JSON: a JSONL line, or a CSV/Parquet cell of a structured column.",
}

# One record: its shape and its content (shapes).
RECORD_CODES: dict[str, str] = {
    "invalid_type": "A value has the wrong type (a line that is not an object, a field that is not a string...).",
    "unknown_shape": "The record matches no supported shape (chat, instruction, preference, text).",
    "unknown_key": "The record or a message has keys the shape does not define (named in the message).",
    "missing_key": "A required key is absent (named in `field`).",
    "missing_field": "A field the job's grader reads ({{item.<field>}}) is absent from the line (named in `field`).",
    "too_many_fields": "A reinforcement prompt line with more fields besides 'messages' than are allowed.",
    "invalid_label": "A KTO example's `label` is not true (desirable) or false (undesirable).",
    "empty_messages": "`messages` (or a prompt conversation) is an empty list.",
    "invalid_role": "A message role outside system, developer, user, assistant, tool.",
    "role_order": "Turns out of order: a system/developer turn not first, an assistant turn not right after "
                  "a user or tool turn, a tool turn not right after an assistant or tool turn, a conversation "
                  "that does not end with an assistant turn (or a preference prompt that does).",
    "invalid_weight": "`weight` other than 0 or 1, or on a message that is not an assistant turn.",
    "no_trainable_turn": "Every assistant turn has weight 0, so there is nothing to learn.",
    "empty_turn": "An empty or whitespace-only turn: an error on an assistant turn that is trained on, "
                  "a warning elsewhere.",
    "unsupported_content": "A content part other than text (images, audio).",
    "invalid_tool_call": "A `tool_calls` entry without the OpenAI shape "
                         "{id, type: 'function', function: {name, arguments: JSON string}}, a duplicate id, "
                         "a function missing from `tools`, `tool_calls` on a turn that is not the assistant's, "
                         "or `tool_call_id` on one that is not a tool result.",
    "unmatched_tool_result": "A tool message whose `tool_call_id` matches no earlier, unanswered tool call.",
    "invalid_tool": "A `tools` entry without the shape {type: 'function', function: {name, description?, "
                    "parameters?}}, or a duplicate tool name.",
    "invalid_preference": "A preference output that is not exactly one assistant message.",
    "identical_preference": "The chosen and rejected answers are identical.",
    "empty_completion": "An instruction example whose completion is empty or whitespace.",
    "empty_prompt": "Warning: an instruction example whose prompt is empty.",
    "empty_text": "A text example whose text is empty or whitespace.",
}

# The file as a whole, once every record is read (structure).
DATASET_CODES: dict[str, str] = {
    "mixed_shapes": "Records of different kinds in one file (e.g. chat and instruction).",
    "shape_mismatch": "The examples' kind does not fit the training method (e.g. chat data for DPO).",
    "too_few_examples": "Fewer valid examples than the method requires.",
}

CODES: dict[str, str] = {**FILE_CODES, **RECORD_CODES, **DATASET_CODES}


def describe(code: str) -> str:
    """The documented meaning of `code`; unknown codes are a programming error."""
    return CODES[code]

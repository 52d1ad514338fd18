"""Write the dataset corpus the ingestion tests read: bad files and good ones.

    python tests/data/make_bad_corpus.py

writes `tests/data/bad/` (one broken dataset per file, plus EXPECTED.json:
file → the code and line of its FIRST error, and the training method it is
checked against when that is not "supervised") and `tests/data/good/` (valid
datasets of every format and shape, plus EXPECTED.json: file → kind and
count). The output is byte-for-byte reproducible — no timestamps, fixed
random seeds — so the committed files can be checked against this script.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def system(content: str) -> dict[str, Any]:
    return {"role": "system", "content": content}


def chat(*turns: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messages": list(turns), **extra}


GOOD_CHAT = chat(user("What is 2 + 2?"), assistant("4"))
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                  "parameters": {"type": "object",
                                                                 "properties": {"city": {"type": "string"}}}}}


def call(call_id: str, name: str = "get_weather", arguments: Any = '{"city": "Paris"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_chat(calls: list[dict[str, Any]], result_id: str = "call_1", **extra: Any) -> dict[str, Any]:
    return chat(user("Weather in Paris?"), assistant(None, tool_calls=calls),
                {"role": "tool", "tool_call_id": result_id, "content": "18C, sunny"},
                assistant("It is 18C and sunny in Paris."), **extra)


def dpo(messages: list[dict[str, Any]], preferred: list[dict[str, Any]],
        rejected: list[dict[str, Any]]) -> dict[str, Any]:
    return {"input": {"messages": messages}, "preferred_output": preferred, "non_preferred_output": rejected}


# --- writers -----------------------------------------------------------------


def jsonl_bytes(rows: list[Any]) -> bytes:
    return b"".join(json.dumps(row, ensure_ascii=False).encode() + b"\n" for row in rows)


def write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def gzip_bytes(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9, mtime=0, filename="") as handle:
        handle.write(data)
    return buffer.getvalue()


def parquet_bytes(table: pa.Table, row_group_rows: int = 1024) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=row_group_rows)
    return buffer.getvalue()


def arrow_stream_bytes(table: pa.Table, batch_rows: int = 2) -> bytes:
    """An Arrow IPC stream, as `datasets` writes its `data-*.arrow` shards."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return sink.getvalue()


def hf_dataset_files(rows: list[dict[str, Any]], shards: int = 1, prefix: str = "") -> dict[str, bytes]:
    """The files of a `save_to_disk` directory holding `rows` in `shards` shards."""
    table = pa.Table.from_pylist(rows)
    size = -(-len(rows) // shards)
    names = [f"data-{index:05d}-of-{shards:05d}.arrow" for index in range(shards)]
    files = {prefix + name: arrow_stream_bytes(table.slice(index * size, size)) for index, name in enumerate(names)}
    state = {"_data_files": [{"filename": name} for name in names], "_fingerprint": "0" * 16,
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
             "_split": None}
    files[prefix + "state.json"] = json.dumps(state, indent=2).encode()
    files[prefix + "dataset_info.json"] = json.dumps({"citation": "", "description": "", "features": {}}).encode()
    return files


def tar_bytes(files: dict[str, bytes], *, compress: bool, links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 0
            archive.addfile(info)
    return gzip_bytes(buffer.getvalue()) if compress else buffer.getvalue()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def random_bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


# --- the bad corpus ----------------------------------------------------------------

# name → (rows or bytes, expected code, expected line, method, field or None)
BadCase = tuple[Any, str, int, str, "str | None"]


def bad_json_cases() -> dict[str, BadCase]:
    """JSON syntax, and the shapes other than chat."""
    two_preferred = dpo([user("Hi")], [assistant("Hello!"), assistant("Hey!")], [assistant("Go away.")])
    return {
        "truncated_json.jsonl": (jsonl_bytes([GOOD_CHAT]) + b'{"messages": [{"role": "user", "content": "Hi"}\n',
                                 "invalid_json", 2, "supervised", None),
        "trailing_comma.jsonl": (jsonl_bytes([GOOD_CHAT, GOOD_CHAT]) + b'{"prompt": "a", "completion": "b",}\n',
                                 "invalid_json", 3, "supervised", None),
        "pretty_printed.json": (json.dumps([GOOD_CHAT], indent=2).encode(), "invalid_json", 1, "supervised", None),
        "array_line.jsonl": ([GOOD_CHAT, [GOOD_CHAT]], "invalid_type", 2, "supervised", None),
        "instruction_empty_completion.jsonl": ([{"prompt": "Say hi", "completion": "hi"},
                                                {"prompt": "Say hi", "completion": " \n"}], "empty_completion", 2,
                                               "supervised", "completion"),
        "instruction_completion_number.jsonl": ([{"prompt": "2+2?", "completion": 4}], "invalid_type", 1,
                                                "supervised", "completion"),
        "instruction_missing_completion.jsonl": ([{"prompt": "2+2?"}], "missing_key", 1, "supervised", "completion"),
        "unknown_shape.jsonl": ([{"question": "2+2?", "answer": "4"}], "unknown_shape", 1, "supervised", None),
        "mixed_shapes.jsonl": ([GOOD_CHAT, GOOD_CHAT, {"prompt": "2+2?", "completion": "4"}], "mixed_shapes", 3,
                               "supervised", None),
        "chat_for_dpo.jsonl": ([GOOD_CHAT], "shape_mismatch", 1, "dpo", None),
        "pref_two_preferred.jsonl": ([two_preferred], "invalid_preference", 1, "dpo", "preferred_output"),
        "pref_identical_pairs.jsonl": ([{"prompt": "Hi", "chosen": "Hello!", "rejected": "Hello! "}],
                                       "identical_preference", 1, "dpo", "rejected"),
        "pref_identical_dpo.jsonl": ([dpo([user("Hi")], [assistant("Hello")], [assistant("Hello")])],
                                     "identical_preference", 1, "dpo", "non_preferred_output"),
        "pref_prompt_ends_with_assistant.jsonl": ([dpo([user("Hi"), assistant("Hello")], [assistant("A")],
                                                       [assistant("B")])], "role_order", 1, "dpo", "input.messages[1]"),
        "pref_output_user_role.jsonl": ([dpo([user("Hi")], [user("A")], [assistant("B")])], "invalid_preference", 1,
                                        "dpo", "preferred_output[0].role"),
        "pref_missing_rejected.jsonl": ([{"prompt": "Hi", "chosen": "Hello"}], "missing_key", 1, "dpo", "rejected"),
        "text_empty.jsonl": ([{"text": "A document."}, {"text": ""}], "empty_text", 2, "cpt", "text"),
        "text_not_string.jsonl": ([{"text": ["a", "b"]}], "invalid_type", 1, "cpt", "text"),
    }


def bad_chat_cases() -> dict[str, BadCase]:
    """Chat records: types, keys, role order, weights."""
    return {
        "messages_not_list.jsonl": ([{"messages": "hello"}], "invalid_type", 1, "supervised", "messages"),
        "content_number.jsonl": ([GOOD_CHAT, chat(user("Hi"), assistant(42))], "invalid_type", 2, "supervised",
                                 "messages[1].content"),
        "invalid_role.jsonl": ([chat(user("Hi"), {"role": "bot", "content": "Hello"})], "invalid_role", 1,
                               "supervised", "messages[1].role"),
        "unknown_top_key.jsonl": ([chat(user("Hi"), assistant("Hello"), meta={"id": 1})], "unknown_key", 1,
                                  "supervised", "meta"),
        "unknown_message_key.jsonl": ([chat({"role": "user", "content": "Hi", "timestamp": 1}, assistant("Yo"))],
                                      "unknown_key", 1, "supervised", "messages[0].timestamp"),
        "missing_role.jsonl": ([GOOD_CHAT, chat(user("Hi"), {"content": "Hello"})], "missing_key", 2,
                               "supervised", "messages[1].role"),
        "missing_content.jsonl": ([chat({"role": "user"}, assistant("Hello"))], "missing_key", 1, "supervised",
                                  "messages[0].content"),
        "empty_messages.jsonl": ([{"messages": []}], "empty_messages", 1, "supervised", "messages"),
        "assistant_first.jsonl": ([chat(assistant("Hello"), user("Hi"), assistant("Bye"))], "role_order", 1,
                                  "supervised", "messages[0].role"),
        "system_in_middle.jsonl": ([GOOD_CHAT, chat(user("Hi"), system("Be brief."), assistant("Hello"))],
                                   "role_order", 2, "supervised", "messages[1].role"),
        "ends_with_user.jsonl": ([chat(user("Hi"), assistant("Hello"), user("Thanks"))], "role_order", 1,
                                 "supervised", "messages[2]"),
        "two_assistant_turns.jsonl": ([chat(user("Hi"), assistant("Hello"), assistant("Again"))], "role_order", 1,
                                      "supervised", "messages[2].role"),
        "no_trainable_turn.jsonl": ([chat(user("Hi"), assistant("Hello", weight=0))], "no_trainable_turn", 1,
                                    "supervised", "messages"),
        "weight_on_user.jsonl": ([chat({"role": "user", "content": "Hi", "weight": 1}, assistant("Hello"))],
                                 "invalid_weight", 1, "supervised", "messages[0].weight"),
        "weight_two.jsonl": ([GOOD_CHAT, GOOD_CHAT, chat(user("Hi"), assistant("Hello", weight=2))],
                             "invalid_weight", 3, "supervised", "messages[1].weight"),
        "weight_bool.jsonl": ([chat(user("Hi"), assistant("Hello", weight=True))], "invalid_weight", 1,
                              "supervised", "messages[1].weight"),
        "empty_assistant_turn.jsonl": ([chat(user("Hi"), assistant("   "))], "empty_turn", 1, "supervised",
                                       "messages[1].content"),
        "image_content.jsonl": ([chat(user([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]),
                                      assistant("A cat."))], "unsupported_content", 1, "supervised",
                                "messages[0].content[0].type"),
        "parallel_tool_calls_string.jsonl": ([chat(user("Hi"), assistant("Hello"), parallel_tool_calls="yes")],
                                             "invalid_type", 1, "supervised", "parallel_tool_calls"),
    }


def bad_tool_cases() -> dict[str, BadCase]:
    """Tool definitions, tool calls and tool results."""
    return {
        "tool_call_bad_arguments.jsonl": ([tool_chat([call("call_1", arguments='{"city": ')])], "invalid_tool_call",
                                          1, "supervised", "messages[1].tool_calls[0].function.arguments"),
        "tool_call_arguments_object.jsonl": ([tool_chat([call("call_1", arguments={"city": "Paris"})])],
                                             "invalid_tool_call", 1, "supervised",
                                             "messages[1].tool_calls[0].function.arguments"),
        "tool_call_missing_id.jsonl": ([tool_chat([{"type": "function", "function": {"name": "get_weather",
                                                                                    "arguments": "{}"}}])],
                                       "invalid_tool_call", 1, "supervised", "messages[1].tool_calls[0].id"),
        "tool_call_duplicate_id.jsonl": ([chat(user("Weather?"), assistant(None, tool_calls=[call("c1"), call("c1")]),
                                               {"role": "tool", "tool_call_id": "c1", "content": "18C"},
                                               assistant("18C"))], "invalid_tool_call", 1, "supervised",
                                         "messages[1].tool_calls[1].id"),
        "tool_calls_on_user.jsonl": ([chat({"role": "user", "content": "Hi", "tool_calls": [call("c1")]},
                                           assistant("Hello"))], "invalid_tool_call", 1, "supervised",
                                     "messages[0].tool_calls"),
        "tool_not_in_tools.jsonl": ([tool_chat([call("call_1", name="get_time")], tools=[WEATHER_TOOL])],
                                    "invalid_tool_call", 1, "supervised", "messages[1].tool_calls[0].function.name"),
        "tool_result_unmatched.jsonl": ([tool_chat([call("call_1")], result_id="call_9")], "unmatched_tool_result",
                                        1, "supervised", "messages[2].tool_call_id"),
        "tool_result_missing_id.jsonl": ([chat(user("Weather?"), assistant(None, tool_calls=[call("c1")]),
                                               {"role": "tool", "content": "18C"}, assistant("18C"))],
                                         "missing_key", 1, "supervised", "messages[2].tool_call_id"),
        "tool_result_without_call.jsonl": ([chat(user("Hi"), {"role": "tool", "tool_call_id": "c1", "content": "x"},
                                                 assistant("Hello"))], "role_order", 1, "supervised",
                                           "messages[1].role"),
        "tools_wrong_type.jsonl": ([tool_chat([call("call_1")], tools=[{"type": "retrieval"}])], "invalid_tool", 1,
                                   "supervised", "tools[0].type"),
    }


def bad_byte_cases() -> dict[str, BadCase]:
    good = jsonl_bytes([GOOD_CHAT])
    bomb_row = json.dumps(chat(user("Hi"), assistant("a" * 4000))).encode() + b"\n"
    latin1_row = json.dumps({"prompt": "café?", "completion": "oui"}, ensure_ascii=False).encode("latin-1")
    garbage = random_bytes(7, 4096)
    return {
        "empty.jsonl": (b"", "empty_file", 0, "supervised", None),
        "whitespace_only.jsonl": (b"  \n\n\t\n   \r\n", "empty_file", 0, "supervised", None),
        "latin1.jsonl": (jsonl_bytes([{"prompt": "a?", "completion": "b"}]) + latin1_row + b"\n",
                         "invalid_encoding", 2, "supervised", None),
        "utf16.jsonl": (json.dumps(GOOD_CHAT).encode("utf-16"), "invalid_encoding", 0, "supervised", None),
        "binary_garbage.bin": (garbage, "binary_file", 0, "supervised", None),
        "garbage_named.jsonl": (garbage, "binary_file", 0, "supervised", None),
        "no_extension_text": (b"hello world\nthis is not a dataset\n", "unsupported_format", 0, "supervised", None),
        "gzip_bomb.jsonl.gz": (gzip_bytes(bomb_row * (32 * 1024 * 1024 // len(bomb_row))), "compression_bomb", 0,
                               "supervised", None),
        "truncated_gzip.jsonl.gz": (_truncated_gzip(), "invalid_compression", 0, "supervised", None),
        # One line past a small `max_line_bytes` (EXPECTED.json carries the limit): the same
        # check as the 8 MiB default, without committing megabytes.
        "enormous_line.jsonl": (good + json.dumps({"text": "x" * 100_000}).encode() + b"\n", "line_too_long", 2,
                                "supervised", None),
    }


def _truncated_gzip() -> bytes:
    """Half of a gzip stream of varied rows (so it does not compress to nothing)."""
    numbers = random.Random(3)
    rows = [chat(user(f"What is {numbers.randrange(10**9)}?"), assistant(f"{numbers.randrange(10**9)}"))
            for _ in range(2000)]
    data = gzip_bytes(jsonl_bytes(rows))
    return data[: len(data) // 2]


def bad_csv_cases() -> dict[str, BadCase]:
    latin1 = "prompt,completion\nhi,there\ncafé?,oui\n".encode("latin-1")
    return {
        "csv_quoting.csv": (b'prompt,completion\nhi,there\n"2+2"?,4\n', "csv_syntax", 3, "supervised", None),
        "csv_unclosed_quote.csv": (b'prompt,completion\nhi,there\nbye,"see you\nlater,ok\n', "csv_syntax", 3,
                                   "supervised", None),
        "csv_short_row.csv": (b"prompt,completion\nhi,there\nalone\n", "csv_syntax", 3, "supervised", None),
        "csv_missing_column.csv": (b"prompt\nhi\nbye\n", "missing_key", 2, "supervised", "completion"),
        "csv_no_usable_columns.csv": (b"question,answer\n2+2?,4\n", "invalid_schema", 1, "supervised", None),
        "csv_duplicate_column.csv": (b"prompt,prompt,completion\na,b,c\n", "invalid_schema", 1, "supervised", None),
        "csv_header_only.csv": (b"prompt,completion\n\n", "empty_file", 0, "supervised", None),
        "csv_bad_messages_json.csv": (b'messages\n"[{""role"": ""user"", ""content"": ""hi""}"\n', "invalid_json", 2,
                                      "supervised", "messages"),
        "csv_latin1.csv": (latin1, "invalid_encoding", 3, "supervised", None),
    }


def bad_parquet_cases() -> dict[str, BadCase]:
    chats = pa.Table.from_pylist([GOOD_CHAT, GOOD_CHAT, chat(assistant("Hello"), user("Hi"), assistant("Bye"))])
    valid = parquet_bytes(chats)
    return {
        "parquet_wrong_schema.parquet": (parquet_bytes(pa.table({"question": ["2+2?"], "answer": ["4"]})),
                                         "invalid_schema", 0, "supervised", None),
        "parquet_truncated.parquet": (valid[: len(valid) // 2], "invalid_parquet", 0, "supervised", None),
        "parquet_bad_row.parquet": (valid, "role_order", 3, "supervised", "messages[0].role"),
        "parquet_gzipped.parquet.gz": (gzip_bytes(valid), "unsupported_format", 0, "supervised", None),
        "parquet_messages_as_bad_json.parquet": (parquet_bytes(pa.table({"messages": ['[{"role": "user"']})),
                                                 "invalid_json", 1, "supervised", "messages"),
        "parquet_no_rows.parquet": (parquet_bytes(pa.table({"text": pa.array([], pa.string())})), "empty_file", 0,
                                    "cpt", None),
    }


def bad_archive_cases() -> dict[str, BadCase]:
    dataset = hf_dataset_files([GOOD_CHAT, chat(user("Hi"), assistant("Hello", weight=5))])
    missing_shard = {name: data for name, data in dataset.items() if not name.endswith(".arrow")}
    payload = {"state.json": b"{}", "../evil.txt": b"owned"}
    return {
        "unsafe_tar.tar": (tar_bytes(payload, compress=False), "unsafe_archive", 0, "supervised", "../evil.txt"),
        "tar_absolute_path.tar.gz": (tar_bytes({"/tmp/evil.txt": b"owned"}, compress=True), "unsafe_archive", 0,
                                     "supervised", "/tmp/evil.txt"),
        "tar_symlink.tar": (tar_bytes({"state.json": b"{}"}, compress=False, links={"data": "/etc"}),
                            "unsafe_archive", 0, "supervised", "data"),
        "zip_traversal.zip": (zip_bytes({"ok/state.json": b"{}", "ok/../../evil.txt": b"owned"}), "unsafe_archive",
                              0, "supervised", "ok/../../evil.txt"),
        "zip_bomb.zip": (zip_bytes({"data-00000-of-00001.arrow": bytes(16 * 1024 * 1024)}), "compression_bomb", 0,
                         "supervised", None),
        "archive_without_dataset.tar.gz": (tar_bytes({"notes/readme.txt": b"hello"}, compress=True),
                                           "invalid_archive", 0, "supervised", None),
        "hf_bad_row.tar.gz": (tar_bytes(dataset, compress=True), "invalid_weight", 2, "supervised",
                              "messages[1].weight"),
        "hf_missing_shard.zip": (zip_bytes(missing_shard), "invalid_hf_dataset", 0, "supervised", None),
        "not_an_archive.zip": (b"PK\x03\x04" + random_bytes(11, 300), "invalid_archive", 0, "supervised", None),
    }


BAD_LIMITS = {"enormous_line.jsonl": {"max_line_bytes": 65536}}


def build_bad(directory: Path) -> dict[str, dict[str, Any]]:
    expected: dict[str, dict[str, Any]] = {}
    cases = {**bad_json_cases(), **bad_chat_cases(), **bad_tool_cases(), **bad_byte_cases(), **bad_csv_cases(),
             **bad_parquet_cases(), **bad_archive_cases()}
    for name, (content, code, line, method, field) in sorted(cases.items()):
        write(directory / name, content if isinstance(content, bytes) else jsonl_bytes(content))
        entry: dict[str, Any] = {"code": code, "line": line}
        if method != "supervised":
            entry["method"] = method
        if field is not None:
            entry["field"] = field
        if name in BAD_LIMITS:
            entry["limits"] = BAD_LIMITS[name]
        expected[name] = entry
    return expected


# --- the good corpus ----------------------------------------------------------------


def build_good(directory: Path) -> dict[str, dict[str, Any]]:
    chats = [
        chat(system("Be brief."), user("Hi"), assistant("Hello", weight=0), user("Code?"), assistant("AB-12")),
        chat(user([{"type": "text", "text": "Two "}, {"type": "text", "text": "parts"}]), assistant("Joined.")),
        chat({"role": "developer", "content": "Answer in French."}, user("Hello"), assistant("Bonjour")),
    ]
    tool_rows = [tool_chat([call("call_1")], tools=[WEATHER_TOOL]),
                 chat(user("Weather?"), assistant("Which city?"), user("Paris"),
                      assistant(None, tool_calls=[call("c7")]), tools=[WEATHER_TOOL], parallel_tool_calls=False)]
    instructions = [{"prompt": "2+2?", "completion": "4"}, {"prompt": "Capital of France?", "completion": "Paris"},
                    {"prompt": "A haiku?", "completion": "Old pond,\nfrog jumps in,\nsplash."}]
    pairs = [{"prompt": "Hi", "chosen": "Hello! How can I help?", "rejected": "What?"},
             {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
             {"prompt": "Name a color", "chosen": '{"color": "blue"}', "rejected": "no"}]
    conversational_pairs = [{"prompt": [user("Hi")], "chosen": [assistant("Hello!")], "rejected": [assistant("Go.")]},
                            {"prompt": [system("Be kind."), user("Help?")], "chosen": [assistant("Sure.")],
                             "rejected": [assistant("No.")]}]
    texts = [{"text": "The first document."}, {"text": "The second one."}, {"text": "A third, longer document."}]
    dpo_rows = [dpo([user("Hi")], [assistant("Hello!")], [assistant("Go away.")]),
                {"input": {"messages": [system("Be kind."), user("Weather?")], "tools": [WEATHER_TOOL]},
                 "preferred_output": [assistant(None, tool_calls=[call("c1")])],
                 "non_preferred_output": [assistant("I cannot know.")]}]
    expected: dict[str, dict[str, Any]] = {}

    def add(name: str, content: bytes, kind: str, count: int, method: str = "supervised", **extra: Any) -> None:
        write(directory / name, content)
        expected[name] = {"kind": kind, "count": count, "method": method, **extra}

    add("chat_basic.jsonl", jsonl_bytes(chats), "chat", 3, format="jsonl")
    add("chat_tools.jsonl", jsonl_bytes(tool_rows), "chat", 2, format="jsonl")
    add("chat_bom_crlf.jsonl", b"\xef\xbb\xbf" + jsonl_bytes([GOOD_CHAT] * 2).replace(b"\n", b"\r\n"), "chat", 2,
        format="jsonl")
    add("chat_empty_user_turn.jsonl", jsonl_bytes([chat(user(""), assistant("Hello"))]), "chat", 1,
        format="jsonl", warnings=["empty_turn"])
    add("chat.jsonl.gz", gzip_bytes(jsonl_bytes([GOOD_CHAT] * 50)), "chat", 50, format="jsonl")
    add("instruction.csv", b"prompt,completion\r\n" + "".join(
        f'"{row["prompt"]}","{row["completion"]}"\r\n' for row in instructions).encode(), "instruction", 3,
        format="csv")
    add("instruction_bom.csv", b"\xef\xbb\xbfprompt,completion\n2+2?,4\n", "instruction", 1, format="csv")
    add("chat_messages.csv", _csv_of_chats(tool_rows[:1] + chats[:1]), "chat", 2, format="csv")
    add("preference_pairs.csv", _csv_of_pairs(pairs), "preference", 3, "dpo", format="csv")
    add("preference_dpo.jsonl", jsonl_bytes(dpo_rows), "preference", 2, "dpo", format="jsonl")
    add("preference_conversational.parquet", parquet_bytes(pa.Table.from_pylist(conversational_pairs)),
        "preference", 2, "orpo", format="parquet")
    add("text.parquet", parquet_bytes(pa.Table.from_pylist(texts), row_group_rows=2), "text", 3, "cpt",
        format="parquet")
    # Arrow needs one type per column: leave out the chat whose content is a list of parts.
    string_chats = [chats[0], chats[2]]
    add("chat.parquet", parquet_bytes(pa.Table.from_pylist(string_chats + tool_rows[:1])), "chat", 3,
        format="parquet")
    add("hf_chat.tar.gz", tar_bytes(hf_dataset_files(string_chats * 3, shards=2, prefix="my_dataset/"),
                                    compress=True), "chat", 6, format="hf_dataset")
    dataset_dict = {"dataset_dict.json": json.dumps({"splits": ["train", "test"]}).encode(),
                    **hf_dataset_files(instructions, prefix="train/"), **hf_dataset_files(instructions[:1],
                                                                                          prefix="test/")}
    add("hf_dataset_dict.zip", zip_bytes(dataset_dict), "instruction", 3, format="hf_dataset")
    shutil.rmtree(directory / "hf_text_dir", ignore_errors=True)
    write_tree(directory / "hf_text_dir", hf_dataset_files(texts, shards=2))
    expected["hf_text_dir"] = {"kind": "text", "count": 3, "method": "cpt", "format": "hf_dataset"}
    return expected


def _csv_of_chats(rows: list[dict[str, Any]]) -> bytes:
    lines = ["messages,tools"]
    for row in rows:
        cells = [json.dumps(row["messages"]), json.dumps(row["tools"]) if "tools" in row else ""]
        lines.append(",".join('"' + cell.replace('"', '""') + '"' if cell else "" for cell in cells))
    return ("\n".join(lines) + "\n").encode()


def _csv_of_pairs(rows: list[dict[str, Any]]) -> bytes:
    lines = ["prompt,chosen,rejected"]
    for row in rows:
        lines.append(",".join('"' + row[key].replace('"', '""') + '"' for key in ("prompt", "chosen", "rejected")))
    return ("\n".join(lines) + "\n").encode()


def build_corpus(bad_dir: Path, good_dir: Path) -> None:
    for directory in (bad_dir, good_dir):
        directory.mkdir(parents=True, exist_ok=True)
    for directory, build in ((bad_dir, build_bad), (good_dir, build_good)):
        expected = build(directory)
        (directory / "EXPECTED.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    build_corpus(root / "bad", root / "good")

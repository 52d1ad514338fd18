from __future__ import annotations

import json

from tests.helpers.cli import Done, run


def _cli(*args: str) -> Done:
    return run(*args, env={"COLUMNS": "200"})


def _chat(i: int) -> str:
    return json.dumps({"messages": [{"role": "user", "content": f"question number {i}"},
                                    {"role": "assistant", "content": f"answer number {i}"}]})


def test_local_validate_reports_the_bad_line_and_exits_1(tmp_path):
    path = tmp_path / "train.jsonl"
    lines = [_chat(i) for i in range(12)]
    lines[4] = '{"messages": [{"role": "user", "content": "x"}'
    path.write_text("\n".join(lines) + "\n")
    result = _cli("files", "validate", str(path), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["errors"]["invalid_json"]["first"][0]["line"] == 5


def test_local_validate_counts_tokens_with_a_model_folder(tmp_path, tiny_model_dir):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(_chat(i) for i in range(12)) + "\n")
    result = _cli("files", "validate", str(path), "--model", str(tiny_model_dir), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["num_examples"] == 12 and report["tokens"]["total"] > 12 * 4
    readable = _cli("files", "validate", str(path), "--model", str(tiny_model_dir))
    assert readable.returncode == 0 and "12 examples" in readable.stdout

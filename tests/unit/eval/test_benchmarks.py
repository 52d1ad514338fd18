"""Benchmark tasks in lm-eval's format: reading, templates, few-shot determinism, the folder jail,
refused keys, and scoring into points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneforge.eval import benchmarks
from tuneforge.eval import gates as eval_gates

QUESTIONS = [{"question": f"What is {i} plus {i}?", "choices": [str(2 * i), str(2 * i + 1), "blue"],
              "answer": i % 3} for i in range(8)]

MC_TASK = """\
task: sums
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/test.jsonl
    train: data/train.jsonl
test_split: test
fewshot_split: train
num_fewshot: {shots}
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: answer
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_task(root: Path, text: str, *, name: str = "task.yaml", rows: list[dict] | None = None,
               folder: str = "sums") -> Path:
    (root / folder / "data").mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(row) + "\n" for row in (rows if rows is not None else QUESTIONS))
    for split in ("test", "train"):
        (root / folder / "data" / f"{split}.jsonl").write_text(data)
    path = root / folder / name
    path.write_text(text)
    return path


def test_a_multiple_choice_task_renders_its_templates(tmp_path):
    write_task(tmp_path, MC_TASK.format(shots=0))
    task = benchmarks.load_named(tmp_path, "sums")
    assert task.output_type == "multiple_choice" and task.metrics == ("acc", "acc_norm")
    first = task.requests[1]
    assert first.context == "Question: What is 1 plus 1?\nAnswer:"
    assert first.choices == (" 2", " 3", " blue") and first.gold == 1


def test_a_target_given_as_the_choice_text_finds_its_index(tmp_path):
    rows = [{"q": "Sky?", "options": ["red", "blue"], "right": "blue"}]
    write_task(tmp_path, "task: sky\ndataset_path: json\ndataset_kwargs: {data_files: {test: data/test.jsonl}}\n"
                         "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{q}}'\n"
                         "doc_to_target: right\ndoc_to_choice: options\ntarget_delimiter: ': '\n", rows=rows)
    task = benchmarks.load_named(tmp_path, "sky")
    assert task.requests[0].choices == (": red", ": blue") and task.requests[0].gold == 1


def test_fewshot_examples_are_drawn_deterministically_and_never_the_document_itself(tmp_path):
    write_task(tmp_path, MC_TASK.format(shots=3).replace("fewshot_split: train\n", ""))
    once = benchmarks.load_named(tmp_path, "sums")
    again = benchmarks.load_named(tmp_path, "sums")
    assert [r.context for r in once.requests] == [r.context for r in again.requests]
    for index, request in enumerate(once.requests):
        shots = request.context.split("\n\n")
        assert len(shots) == 4 and shots[-1] == f"Question: What is {index} plus {index}?\nAnswer:"
        assert f"What is {index} plus" not in "\n\n".join(shots[:-1])  # sampled from the test split itself
        for shot in shots[:-1]:
            number = int(shot.split("What is ")[1].split(" ")[0])
            assert shot.endswith(f"Answer: {QUESTIONS[number]['choices'][QUESTIONS[number]['answer']]}")
    # the examples differ between documents (a fixed seed per document, not one sample for all)
    assert len({r.context.rsplit("\n\n", 1)[0] for r in once.requests}) > 1


def test_first_n_takes_the_first_examples(tmp_path):
    write_task(tmp_path, MC_TASK.format(shots=2) + "fewshot_config: {sampler: first_n}\n")
    task = benchmarks.load_named(tmp_path, "sums")
    assert task.requests[5].context.startswith("Question: What is 0 plus 0?\nAnswer: 0\n\n"
                                               "Question: What is 1 plus 1?\nAnswer: 3\n\n")


def test_a_generation_task_reads_until_max_gen_toks_and_filters(tmp_path):
    rows = [{"q": "2+2", "a": "4"}, {"q": "3+3", "a": "6"}]
    write_task(tmp_path, "task: arith\ndataset_path: data\ntest_split: test\noutput_type: generate_until\n"
                         "doc_to_text: \"Q: {{q}}\\nA:\"\ndoc_to_target: ' {{a}}'\n"
                         "generation_kwargs: {until: [\"\\n\"], max_gen_toks: 5}\n"
                         "metric_list: [{metric: exact_match, ignore_case: true}]\n"
                         "filter_list: [{name: get, filter: [{function: regex, regex_pattern: '(\\d+)'}, "
                         "{function: take_first}]}]\n", rows=rows)
    task = benchmarks.load_named(tmp_path, "arith")
    assert task.until == ("\n",) and task.max_gen_toks == 5 and task.requests[0].target == " 4"
    assert benchmarks.generation_scores(
        task, [" 4\nQ: more", " the answer is 7"]) == {"exact_match": 0.0}  # the regex drops the space
    task_plain = benchmarks.BenchmarkTask("a", "generate_until", ("exact_match",), task.requests, ("\n",))
    assert benchmarks.generation_scores(task_plain, [" 4\nQ: more", " 7"]) == {"exact_match": 50.0}


def test_include_merges_a_template_from_the_same_folder(tmp_path):
    base = MC_TASK.format(shots=0).replace("task: sums\n", "")
    write_task(tmp_path, base, name="_template.yaml")
    write_task(tmp_path, "include: _template.yaml\ntask: sums_two\nlimit: 2\n", name="two.yaml")
    task = benchmarks.load_named(tmp_path, "sums_two")
    assert len(task.requests) == 2 and task.requests[0].choices == (" 0", " 1", " blue")


@pytest.mark.parametrize("data_file", ["/etc/passwd", "../outside.jsonl", "data/../../outside.jsonl",
                                       "https://example.com/test.jsonl", "hf://datasets/x/y"])
def test_data_outside_the_benchmark_folder_is_refused(tmp_path, data_file):
    (tmp_path / "outside.jsonl").write_text(json.dumps(QUESTIONS[0]) + "\n")
    root = tmp_path / "benchmarks"
    write_task(root, MC_TASK.format(shots=0).replace("test: data/test.jsonl", f"test: '{data_file}'"))
    with pytest.raises(benchmarks.BenchmarkError) as caught:
        benchmarks.load_named(root, "sums")
    assert caught.value.key == "dataset_kwargs.data_files" and "sums/task.yaml" in str(caught.value)


def test_a_link_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "secret.jsonl").write_text(json.dumps(QUESTIONS[0]) + "\n")
    root = tmp_path / "benchmarks"
    write_task(root, MC_TASK.format(shots=0).replace("data/test.jsonl", "data/link.jsonl"))
    (root / "sums" / "data" / "link.jsonl").symlink_to(tmp_path / "secret.jsonl")
    with pytest.raises(benchmarks.BenchmarkError, match="leads outside the benchmark folder"):
        benchmarks.load_named(root, "sums")


def test_a_hub_dataset_is_refused(tmp_path):
    write_task(tmp_path, MC_TASK.format(shots=0).replace(
        "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: data/test.jsonl\n    train: data/train.jsonl\n",
        "dataset_path: allenai/ai2_arc\n"))
    with pytest.raises(benchmarks.BenchmarkError, match="not a local file or folder") as caught:
        benchmarks.load_named(tmp_path, "sums")
    assert caught.value.key == "dataset_path"


@pytest.mark.parametrize(("extra", "key", "words"), [
    ("process_docs: !function utils.process_docs\n", "process_docs", "!function"),
    ("doc_to_text: !function utils.doc_to_text\n", "doc_to_text", "!function"),
    ("process_results: mean\n", "process_results", "runs Python"),
    ("some_new_key: 1\n", "some_new_key", "not a supported task key"),
    ("filter_list: [{name: x, filter: [{function: majority_vote}]}]\n", "filter_list[0].filter[0]",
     "majority_vote"),
    ("metric_list: [{metric: bleu}]\n", "metric_list[0]", "bleu"),
    ("dataset_name: ARC-Easy\n", "dataset_name", "hub"),
    ("num_fewshot: 99\n", "num_fewshot", "0 to 25"),
])
def test_unsupported_keys_fail_at_load_naming_file_and_key(tmp_path, extra, key, words):
    given = extra.split(":")[0]  # a key the task already has is replaced, not given twice
    text = "".join(line + "\n" for line in MC_TASK.format(shots=0).split("metric_list:")[0].splitlines()
                   if not line.startswith(given + ":"))
    write_task(tmp_path, text + extra)
    with pytest.raises(benchmarks.BenchmarkError) as caught:
        benchmarks.load_task(tmp_path / "sums" / "task.yaml", tmp_path)
    assert caught.value.key == key and words in str(caught.value) and "sums/task.yaml" in str(caught.value)


def test_templates_run_sandboxed(tmp_path):
    write_task(tmp_path, MC_TASK.format(shots=0).replace(
        '"Question: {{question}}\\nAnswer:"', "\"{{ ''.__class__.__mro__[1].__subclasses__() }}\""))
    with pytest.raises(benchmarks.BenchmarkError, match="the template failed") as caught:
        benchmarks.load_named(tmp_path, "sums")
    assert caught.value.key == "doc_to_text"


def test_a_template_that_renders_too_much_is_refused(tmp_path):
    write_task(tmp_path, MC_TASK.format(shots=0).replace(
        '"Question: {{question}}\\nAnswer:"', "\"{{ 'x' * 200000 }}\""))
    with pytest.raises(benchmarks.BenchmarkError, match="renders 200000 characters"):
        benchmarks.load_named(tmp_path, "sums")


def test_a_name_is_looked_up_never_used_as_a_path(tmp_path):
    write_task(tmp_path, MC_TASK.format(shots=0))
    for name in ("../sums", "sums/task.yaml", "/etc/passwd", ""):
        with pytest.raises(benchmarks.BenchmarkError):
            benchmarks.load_named(tmp_path, name)
    with pytest.raises(benchmarks.BenchmarkError, match=r"offered: sums"):
        benchmarks.load_named(tmp_path, "mmlu")


def test_acc_and_acc_norm_in_points():
    requests = (benchmarks.Request("q", (" a", " bbbb"), gold=1), benchmarks.Request("q", (" a", " bbbb"), gold=0))
    task = benchmarks.BenchmarkTask("t", "multiple_choice", ("acc", "acc_norm"), requests)
    # the long choice is likelier in total but less likely per byte
    scores = [[-4.0, -3.0], [-4.0, -3.0]]
    assert benchmarks.choice_scores(task, scores) == {"acc": 50.0, "acc_norm": 50.0}
    assert benchmarks.result_keys(task, {"acc": 50.0, "acc_norm": 25.0}) == {
        "benchmark:t": 50.0, "benchmark:t.acc": 50.0, "benchmark:t.acc_norm": 25.0}


def test_a_points_gate_allows_a_regression_of_at_most_n_points():
    [gate] = eval_gates.parse_gates([{"metric": "benchmark:sums", "max_regression_points": 2}])
    assert (gate.op, gate.threshold, gate.relative_to_base) == (">=", -2.0, True)
    within = eval_gates.check([gate], {"base": {"benchmark:sums": 50.0}, "fine_tuned": {"benchmark:sums": 48.5}})
    beyond = eval_gates.check([gate], {"base": {"benchmark:sums": 50.0}, "fine_tuned": {"benchmark:sums": 47.5}})
    assert within.passed and not beyond.passed
    assert "fell by 2.50 points" in beyond.failures[0].reason
    assert eval_gates.failure_kind(beyond.failures[0]) == "forgetting"
    missing = eval_gates.check([gate], {"base": {}, "fine_tuned": {}})
    assert "eval.benchmarks" in missing.failures[0].reason
    with pytest.raises(Exception, match="not both"):
        eval_gates.parse_gates([{"metric": "benchmark:sums", "max_regression_points": 2, "op": ">="}])


def test_yaml_aliases_that_expand_are_bounded(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{n}: &a{n} [*a{n - 1}, *a{n - 1}, *a{n - 1}, *a{n - 1}, *a{n - 1}, *a{n - 1}, *a{n - 1}, *a{n - 1}]"
              for n in range(1, 9)]
    write_task(tmp_path, MC_TASK.format(shots=0) + "metadata:\n" + "".join(f"  {line}\n" for line in lines))
    with pytest.raises(benchmarks.BenchmarkError, match="more than 100000 values"):
        benchmarks.load_task(tmp_path / "sums" / "task.yaml", tmp_path)


def test_the_job_body_gate_shorthand_reads_as_a_relative_gate():
    from pydantic import ValidationError

    from tuneforge.domain.job_config import EvalConfig

    config = EvalConfig(benchmarks=["sums"], gates=[{"metric": "benchmark:sums", "max_regression_points": 2}])
    gate = config.gates[0]
    assert (gate.op, gate.threshold, gate.relative_to_base, gate.max_regression_points) == (">=", -2.0, True, None)
    with pytest.raises(ValidationError, match="not both"):
        EvalConfig(gates=[{"metric": "benchmark:sums", "max_regression_points": 2, "op": "<="}])
    with pytest.raises(ValidationError):
        EvalConfig(benchmarks=["../sums"])

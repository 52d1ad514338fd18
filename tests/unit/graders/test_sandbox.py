"""Python graders in the sandbox: what a grader's source gets back, sample by sample.

These start real sandboxes (bubblewrap); they are skipped, with the reason, only where
`available()` says this host cannot sandbox (scripts/sandbox-deps.sh installs bubblewrap). The
attacks are tests/security/test_grader_sandbox.py.
"""

from __future__ import annotations

import errno
import struct
import time

import pytest

from tuneforge.graders import sandbox_seccomp
from tuneforge.graders.sandbox import ERRORS, PythonOutcome, PythonSandbox, SandboxLimits, available

# small, so that a timeout costs little; generous for a trivial grader on a loaded 2-core machine
LIMITS = SandboxLimits(wall_time_s=1.5, cpu_time_s=4, memory_bytes=256 << 20, scratch_bytes=4 << 20)
SAMPLE = {"output_text": "Paris", "output_json": None, "output_tools": [], "choices": []}
ITEM = {"reference": "Paris", "weight": 0.75}


def _sandbox(source: str, limits: SandboxLimits = LIMITS) -> PythonSandbox:
    """A sandbox for `source`; the test is skipped where this host cannot sandbox."""
    reason = available()
    if reason is not None:
        pytest.skip(reason)
    return PythonSandbox(source, limits=limits)


def _grade(source: str, calls: list[tuple[dict, dict]] | None = None) -> list[PythonOutcome]:
    with _sandbox(source) as sandbox:
        return sandbox.grade_many(calls if calls is not None else [(SAMPLE, ITEM)])


def _scores(outcomes: list[PythonOutcome]) -> list[float | None]:
    return [outcome.score for outcome in outcomes]


def test_a_grader_scores_from_the_sample_and_the_item():
    source = ("def grade(sample, item):\n"
              "    return item['weight'] if sample['output_text'] == item['reference'] else 0.25\n")
    outcomes = _grade(source, [(SAMPLE, ITEM), ({**SAMPLE, "output_text": "Lyon"}, ITEM)])
    assert _scores(outcomes) == [0.75, 0.25]
    assert all(outcome.error is None and outcome.details is None for outcome in outcomes)
    assert all(0 <= outcome.execution_time_s < LIMITS.wall_time_s for outcome in outcomes)


def test_the_calls_of_a_sandbox_share_one_process():
    source = "calls = 0\ndef grade(sample, item):\n    global calls\n    calls += 1\n    return calls\n"
    with _sandbox(source) as sandbox:
        assert sandbox.check() is None
        assert _scores(sandbox.grade_many([(SAMPLE, ITEM)] * 3)) == [1.0, 2.0, 3.0]
        assert _scores(sandbox.grade_many([(SAMPLE, ITEM)])) == [4.0]  # the next batch, the same process


def test_a_syntax_error_names_its_line():
    source = "def grade(sample, item):\n    return (1 +\n"
    with _sandbox(source) as sandbox:
        problem = sandbox.check()
        assert problem is not None and problem.error == "syntax_error" and problem.score is None
        assert problem.details is not None and problem.details.startswith("line 2:")
        assert [outcome.error for outcome in sandbox.grade_many([(SAMPLE, ITEM)] * 2)] == ["syntax_error"] * 2


@pytest.mark.parametrize(("source", "details"), [
    ("x = 1\n", "the source defines no callable grade(sample, item)"),
    ("grade = 0.5\n", "the source defines no callable grade(sample, item)"),
    ("import json\n1 / 0\ndef grade(sample, item):\n    return 1\n", "ZeroDivisionError: division by zero"),
    ("import tuneforge\n", "ModuleNotFoundError: No module named 'tuneforge'"),  # the platform is not there
])
def test_a_source_without_a_usable_grade_is_a_runtime_error(source, details):
    with _sandbox(source) as sandbox:
        problem = sandbox.check()
    assert problem is not None and (problem.error, problem.details) == ("runtime_error", details)


def test_an_exception_in_grade_is_a_runtime_error_with_its_type_and_message():
    source = "def grade(sample, item):\n    raise ValueError(f\"no answer for {item['reference']}\")\n"
    (outcome,) = _grade(source)
    assert (outcome.score, outcome.error, outcome.details) == (None, "runtime_error", "ValueError: no answer for Paris")


def test_details_are_bounded():
    (outcome,) = _grade("def grade(sample, item):\n    raise RuntimeError('x' * 10_000)\n")
    assert outcome.error == "runtime_error" and outcome.details is not None
    assert len(outcome.details) == 500 and outcome.details.startswith("RuntimeError: xxx")


@pytest.mark.parametrize("returned", ['"x"', "None", 'float("nan")', 'float("inf")', "[0.5]", "10 ** 400"])
def test_what_is_not_a_finite_number_is_non_number(returned):
    (outcome,) = _grade(f"def grade(sample, item):\n    return {returned}\n")
    assert outcome.score is None and outcome.error == "non_number" and outcome.details


@pytest.mark.parametrize(("returned", "score"), [("1", 1.0), ("0.5", 0.5), ("-2", -2.0), ("True", 1.0), ("False", 0.0)])
def test_ints_floats_and_bools_are_numbers(returned, score):
    (outcome,) = _grade(f"def grade(sample, item):\n    return {returned}\n")
    assert (outcome.score, outcome.error) == (score, None)


def test_a_sample_that_times_out_does_not_stop_the_next_one():
    source = ("calls = 0\n"
              "def grade(sample, item):\n"
              "    global calls\n"
              "    calls += 1\n"
              "    while item.get('spin'):\n"
              "        pass\n"
              "    return calls\n")
    started = time.monotonic()
    outcomes = _grade(source, [(SAMPLE, {"spin": True}), (SAMPLE, ITEM), (SAMPLE, ITEM)])
    assert [outcome.error for outcome in outcomes] == ["timeout", None, None]
    assert outcomes[0].details == "the grader did not answer within 1.5 s"
    assert LIMITS.wall_time_s <= outcomes[0].execution_time_s < LIMITS.wall_time_s + 1
    assert _scores(outcomes)[1:] == [1.0, 2.0]  # a fresh process (its counter restarted) carried on
    assert time.monotonic() - started < LIMITS.wall_time_s + 5


def test_a_grader_that_ends_its_process_is_a_runtime_error_and_the_next_sample_scores():
    source = "import os\ndef grade(sample, item):\n    if item.get('exit'):\n        os._exit(3)\n    return 0.5\n"
    outcomes = _grade(source, [(SAMPLE, {"exit": True}), (SAMPLE, ITEM)])
    assert [outcome.error for outcome in outcomes] == ["runtime_error", None]
    assert outcomes[0].details == "the grader's process ended before answering (exit status 3)"
    assert outcomes[1].score == 0.5


def test_the_cpu_time_limit_ends_a_sample_as_a_timeout():
    limits = SandboxLimits(wall_time_s=10.0, cpu_time_s=1)  # a wall time a loaded machine cannot reach first
    with _sandbox("def grade(sample, item):\n    while True:\n        pass\n", limits) as sandbox:
        (outcome,) = sandbox.grade_many([(SAMPLE, ITEM)])
    assert (outcome.error, outcome.details) == ("timeout", "the grader's CPU time limit (1 s) was reached")
    assert outcome.execution_time_s < limits.wall_time_s


def test_a_sample_the_platform_cannot_send_is_a_sandbox_error():
    outcomes = _grade("def grade(sample, item):\n    return 1\n", [(SAMPLE, {"x": object()}), (SAMPLE, ITEM)])
    assert [outcome.error for outcome in outcomes] == ["sandbox_error", None]


def test_a_source_over_the_limit_is_refused_before_any_sandbox_starts():
    limits = SandboxLimits(source_bytes=64)
    with _sandbox("def grade(sample, item):\n    return 1\n" + "#" * 64, limits) as sandbox:
        problem = sandbox.check()
    assert problem is not None and problem.error == "syntax_error" and "over 64 bytes" in (problem.details or "")


def test_every_error_is_in_the_vocabulary():
    assert set(ERRORS) == {"syntax_error", "runtime_error", "timeout", "non_number", "memory_error",
                           "output_too_large", "sandbox_error"}


def test_available_says_yes_here_and_caches_its_answer():
    _sandbox("").close()  # skips where the host cannot sandbox
    assert available() is None
    started = time.monotonic()
    assert available() is None
    assert time.monotonic() - started < 0.05  # cached: no sandbox started


def test_available_refuses_an_interpreter_the_sandbox_does_not_hold(tmp_path):
    # the platform's own python (a virtual environment, pyenv under the home) is outside /usr
    reason = available(str(tmp_path / "python3"))
    assert reason is not None and reason.startswith("python graders are not available on this server: ")
    assert str(tmp_path) not in reason  # tenant-safe: no host path


# The seccomp filter, run here by a small classic-BPF interpreter for both architectures it knows
# (the host runs one of them; the attack suite checks the filter there for real).
ALLOW, KILL = sandbox_seccomp.RET_ALLOW, sandbox_seccomp.RET_KILL_PROCESS
EPERM, ENOSYS = sandbox_seccomp.RET_ERRNO | errno.EPERM, sandbox_seccomp.RET_ERRNO | errno.ENOSYS
READ = {"x86_64": 0, "aarch64": 63}
AUDIT_ARCH_I386 = 0x40000003
CLONE_NEWUSER, SIGCHLD, AF_INET = 0x10000000, 17, 2


def _verdict(arch_value: int, number: int, arg0: int = 0) -> int:
    program = sandbox_seccomp.program()
    data = struct.pack("=IIQ6Q", number, arch_value, 0, arg0, 0, 0, 0, 0, 0)  # struct seccomp_data
    position, accumulator = 0, 0
    while True:
        code, jump_true, jump_false, k = struct.unpack_from("=HBBI", program, position * 8)
        if code == sandbox_seccomp.BPF_LD_W_ABS:
            (accumulator,) = struct.unpack_from("=I", data, k)
            position += 1
        elif code == sandbox_seccomp.BPF_RET_K:
            return k
        else:
            taken = {sandbox_seccomp.BPF_JEQ_K: accumulator == k, sandbox_seccomp.BPF_JGE_K: accumulator >= k,
                     sandbox_seccomp.BPF_JSET_K: bool(accumulator & k)}[code]
            position += 1 + (jump_true if taken else jump_false)


@pytest.mark.parametrize("column", [0, 1], ids=list(sandbox_seccomp.ARCHES))
def test_the_seccomp_filter_of_each_architecture(column):
    arch = list(sandbox_seccomp.ARCHES)[column]
    audit_arch = sandbox_seccomp.ARCHES[arch]
    for name, numbers in sandbox_seccomp.DENIED.items():
        assert _verdict(audit_arch, numbers[column]) == EPERM, name
    socket_nr, clone_nr, clone3_nr = (sandbox_seccomp.CHECKED[name][column] for name in ("socket", "clone", "clone3"))
    assert _verdict(audit_arch, READ[arch]) == ALLOW
    assert _verdict(audit_arch, socket_nr, sandbox_seccomp.AF_UNIX) == ALLOW
    assert _verdict(audit_arch, socket_nr, AF_INET) == EPERM
    assert _verdict(audit_arch, clone_nr, SIGCHLD) == ALLOW  # fork()
    assert _verdict(audit_arch, clone_nr, SIGCHLD | CLONE_NEWUSER) == EPERM
    assert _verdict(audit_arch, clone3_nr) == ENOSYS
    assert _verdict(AUDIT_ARCH_I386, READ[arch]) == KILL  # a 32-bit call on a 64-bit kernel


def test_x32_calls_are_refused():
    assert _verdict(sandbox_seccomp.ARCHES["x86_64"], sandbox_seccomp.X32_SYSCALL_BIT | READ["x86_64"]) == EPERM

"""Attack: a tenant's python grader tries to read, reach or exhaust what is not its own.

Each attack is a grader's source run in a real sandbox (bubblewrap, graders/sandbox.py). It tries,
and reports what it could do: it raises an exception whose message is a JSON report, which comes
back as the outcome's details (at most 500 characters, so reports are terse: an errno name, or
"done" where the action succeeded). Every attack must be contained: it scores as an error or 0,
or its report shows it saw nothing. After each one the platform is checked: no process of its
sandboxes is left (by this process's sandbox uids when it runs as root, and by bwrap children of
this process), a normal grader still scores, and this process can still fork.

Secrets are planted where a careless sandbox would show them: in this process's environment, in a
secrets key file and another tenant's object under a data folder of the test's, and the
platform's home, repository and interpreter are named to the grader by their host paths.

Skipped (with the reason) only where `available()` says the host cannot sandbox; CI installs
bubblewrap (scripts/sandbox-deps.sh), so there it runs.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tuneforge
from tuneforge.graders import sandbox_seccomp
from tuneforge.graders.sandbox import PythonOutcome, PythonSandbox, SandboxLimits, available
from tuneforge.graders.sandbox_process import SANDBOX_ENV, uid_range

MARKER = "planted-5f1c0e7a"
PLANTED_NAMES = ("TUNEFORGE_SECRETS_KEY", "TUNEFORGE_ADMIN_API_KEY", "AWS_SECRET_ACCESS_KEY")
LIMITS = SandboxLimits(wall_time_s=2.0, cpu_time_s=4, memory_bytes=256 << 20, processes=16,
                       scratch_bytes=4 << 20, output_bytes=64 << 10)
TIMEOUT_BOUND_S = LIMITS.wall_time_s + 1.0  # the kill and its reaping, on a loaded machine
SAMPLE = {"output_text": "yes", "output_json": None, "output_tools": [], "choices": []}
ITEM = {"reference": "yes"}
NORMAL = "def grade(sample, item):\n    return 0.75 if sample['output_text'] == item['reference'] else 0.0\n"
# what every attack starts with: probe() runs an action and names what stopped it
PRELUDE = '''
import errno, json, os
def probe(action):
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, type(exc).__name__)
    except BaseException as exc:
        return type(exc).__name__
    return "done"
def report(**seen):
    raise Exception("REPORT " + json.dumps(seen, sort_keys=True))
'''


@pytest.fixture(scope="module", autouse=True)
def _sandbox_host() -> None:
    reason = available()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def planted(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PLANTED_NAMES:
        monkeypatch.setenv(name, f"{MARKER}-{name}")


def _processes() -> list[dict[str, str]]:
    """Every process's /proc status fields (what ps reads; /proc needs no procps in the image)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "status").read_text()
        except OSError:  # it ended meanwhile
            continue
        found.append({key: value.strip() for key, value in (line.split(":", 1) for line in text.splitlines())})
    return found


def _leftovers() -> list[str]:
    """This process's sandbox processes still alive: bwrap children, and (as root) any process
    of its sandboxes' uids, wherever it was reparented."""
    me = os.getpid()
    uids = uid_range(me) if os.geteuid() == 0 else range(0)
    return [f"pid {fields['Pid']} {fields['Name']} uid {fields['Uid'].split()[0]} {fields['State']}"
            for fields in _processes()
            if int(fields["Uid"].split()[0]) in uids or (int(fields["PPid"]) == me and fields["Name"] == "bwrap")]


@pytest.fixture(autouse=True)
def platform_still_fine() -> Iterator[None]:
    yield
    assert _leftovers() == []
    (outcome,) = _run(NORMAL)
    assert outcome.score == 0.75
    assert subprocess.run(["true"], timeout=30).returncode == 0  # this process still forks
    assert _leftovers() == []


def _run(source: str, calls: int = 1, limits: SandboxLimits = LIMITS) -> list[PythonOutcome]:
    with PythonSandbox(source, limits=limits) as sandbox:
        return sandbox.grade_many([(SAMPLE, ITEM)] * calls)


def _report(outcome: PythonOutcome) -> dict:
    assert outcome.error == "runtime_error" and outcome.details is not None, outcome
    assert outcome.details.startswith("Exception: REPORT "), outcome.details
    return json.loads(outcome.details.removeprefix("Exception: REPORT "))


def _attack(body: str, **values: object) -> dict:
    """Runs PRELUDE, the `values` as constants, then `body` (which defines grade); its report."""
    constants = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    (outcome,) = _run(PRELUDE + constants + body)
    seen = _report(outcome)
    print(f"observed: {seen}")  # what the attack could do, in the test's output
    return seen


def test_the_platforms_files_are_out_of_sight(tmp_path):
    data = tmp_path / "data"
    key = data / "secrets.key"
    other_tenant = data / "objects" / "tenants" / "other-tenant" / "files" / "file-1" / "train.jsonl"
    other_tenant.parent.mkdir(parents=True)
    key.write_text(MARKER)
    other_tenant.write_text(json.dumps({"text": MARKER}))
    paths = {"home": os.path.expanduser("~"), "root": "/root", "repo": str(Path(tuneforge.__file__).parents[2]),
             "python": sys.executable, "key": str(key), "other": str(other_tenant), "shadow": "/etc/shadow",
             "via_proc": "/proc/1/root" + str(key)}
    seen = _attack('''
def read(path):
    if os.path.isdir(path):
        return os.listdir(path)
    with open(path, "rb") as handle:
        return handle.read()
def grade(sample, item):
    found = {name: probe(lambda path=path: read(path)) for name, path in PATHS.items()}
    with open("/proc/1/environ", "rb") as handle:
        found["environ_marker"] = MARKER.encode() in handle.read()
    found["pids"] = sorted(name for name in os.listdir("/proc") if name.isdigit())
    found["top"] = sorted(os.listdir("/"))
    report(**found)
''', PATHS=paths, MARKER=MARKER)
    assert {name: seen[name] for name in paths} == dict.fromkeys(paths, "ENOENT")
    assert seen["environ_marker"] is False
    assert seen["pids"] == ["1"]  # its own pid namespace: the grader's interpreter alone
    assert seen["top"] == ["bin", "dev", "lib", "lib64", "proc", "sandbox", "tmp", "usr"]


def test_the_environment_is_the_allow_list():
    seen = _attack('''
def grade(sample, item):
    with open("/proc/self/environ", "rb") as handle:
        raw = handle.read()
    report(environ=dict(os.environ), marker=MARKER in str(os.environ) or MARKER.encode() in raw)
''', MARKER=MARKER)
    # bwrap sets PWD itself (the working directory, /tmp)
    assert seen["environ"] == {**SANDBOX_ENV, "PWD": "/tmp"}
    assert seen["marker"] is False


def test_there_is_no_network():
    listener = socket.create_server(("127.0.0.1", 0))
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    try:
        seen = _attack('''
import socket
def tcp():
    socket.create_connection(("127.0.0.1", TCP_PORT), timeout=1).close()
def udp():
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"leak", ("127.0.0.1", UDP_PORT))
def grade(sample, item):
    report(tcp=probe(tcp), udp=probe(udp), inet6=probe(lambda: socket.socket(socket.AF_INET6)),
           packet=probe(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)),
           netlink=probe(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),
           dns=probe(lambda: socket.getaddrinfo("example.com", 443)),
           unix=probe(lambda: socket.socket(socket.AF_UNIX).close()))
''', TCP_PORT=listener.getsockname()[1], UDP_PORT=receiver.getsockname()[1])
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()  # no connection reached the listener
        receiver.settimeout(0.2)
        with pytest.raises(TimeoutError):
            receiver.recv(16)
    finally:
        listener.close()
        receiver.close()
    assert {name: seen[name] for name in ("tcp", "udp", "inet6", "packet", "netlink")} == dict.fromkeys(
        ("tcp", "udp", "inet6", "packet", "netlink"), "EPERM")
    assert seen["dns"] == "gaierror"
    assert seen["unix"] == "done"  # AF_UNIX is allowed: a private network namespace, nothing to reach


def test_a_fork_bomb_is_held_by_the_process_limit():
    outcomes = _run("import os\ndef grade(sample, item):\n    while True:\n        os.fork()\n", calls=2)
    assert [outcome.error for outcome in outcomes] == ["runtime_error"] * 2
    assert all(outcome.details == "BlockingIOError: [Errno 11] Resource temporarily unavailable"
               for outcome in outcomes)
    assert all(outcome.execution_time_s < LIMITS.wall_time_s for outcome in outcomes)


def test_a_fork_bomb_that_swallows_errors_is_killed_at_the_wall_time():
    source = "import os\ndef grade(sample, item):\n    while True:\n        try:\n            os.fork()\n" \
             "        except OSError:\n            pass\n"
    (outcome,) = _run(source)
    assert outcome.error == "timeout" and outcome.execution_time_s < TIMEOUT_BOUND_S


def test_processes_left_behind_by_a_call_are_gone_before_the_next():
    source = PRELUDE + '''
import time
def grade(sample, item):
    if item.get("spawn"):
        for _ in range(4):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(600)
                os._exit(0)
        return 0.0
    report(pids=sorted(name for name in os.listdir("/proc") if name.isdigit()))
'''
    with PythonSandbox(source, limits=LIMITS) as sandbox:
        first, second = sandbox.grade_many([(SAMPLE, {"spawn": True}), (SAMPLE, {})])
    assert first.score == 0.0
    assert _report(second) == {"pids": ["1"]}  # the same process, and nothing it forked


def test_a_fork_bomb_is_held_when_the_platform_is_not_root(tmp_path):
    """The other way RLIMIT_NPROC is set: the platform's own uid, its count plus the limit. This
    process (root) starts a copy of the sandbox modules as nobody, on the OS's python."""
    if os.geteuid() != 0:
        pytest.skip("this process is not root: the other tests run the sandbox that way already")
    package = Path(tempfile.mkdtemp(prefix="grader-sandbox-"))
    try:
        graders = package / "tuneforge" / "graders"
        graders.mkdir(parents=True)
        for name in ("tuneforge/__init__.py", "tuneforge/graders/__init__.py"):
            (package / name).write_text("")
        for module in ("sandbox", "sandbox_process", "sandbox_seccomp", "sandbox_child"):
            shutil.copy(Path(sandbox_seccomp.__file__).with_name(f"{module}.py"), graders)
        for path in [package, *package.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        script = ("import json, os\nfrom tuneforge.graders.sandbox import PythonSandbox, SandboxLimits\n"
                  "source = 'import os\\ndef grade(sample, item):\\n    while True:\\n        os.fork()\\n'\n"
                  "with PythonSandbox(source, limits=SandboxLimits(wall_time_s=2.0)) as sandbox:\n"
                  "    outcome, = sandbox.grade_many([({}, {})])\n"
                  "print(json.dumps([os.getuid(), outcome.error, outcome.details]))\n")
        nobody = 65534
        done = subprocess.run(["/usr/bin/python3", "-c", script], env={"PATH": "/usr/bin", "PYTHONPATH": str(package)},
                              cwd="/", user=nobody, group=nobody, extra_groups=[], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        uid, error, details = json.loads(done.stdout.splitlines()[-1])
        assert (uid, error) == (nobody, "runtime_error")
        assert details == "BlockingIOError: [Errno 11] Resource temporarily unavailable"
        left = [fields["Name"] for fields in _processes() if int(fields["Uid"].split()[0]) == nobody]
        assert not [name for name in left if name == "bwrap" or name.startswith("python")], left
    finally:
        shutil.rmtree(package)


@pytest.mark.parametrize(("body", "errors"), [
    ("    return len(b'x' * 10**10)\n", {"memory_error"}),
    ("    hoard = []\n    while True:\n        hoard.append(' ' * 2**20)\n", {"memory_error", "runtime_error"}),
])
def test_unbounded_allocation_is_a_memory_error(body, errors):
    (outcome,) = _run("def grade(sample, item):\n" + body)
    assert outcome.error in errors and outcome.execution_time_s < LIMITS.wall_time_s


@pytest.mark.parametrize("source", [
    "def grade(sample, item):\n    while True:\n        pass\n",
    "import signal\nfor name in ('SIGALRM', 'SIGTERM', 'SIGINT', 'SIGHUP', 'SIGXCPU'):\n"
    "    signal.signal(getattr(signal, name), signal.SIG_IGN)\n"
    "def grade(sample, item):\n    while True:\n        pass\n",
])
def test_a_grader_that_never_returns_is_killed_at_the_wall_time(source):
    started = time.monotonic()
    (outcome,) = _run(source)
    assert outcome.error == "timeout" and LIMITS.wall_time_s <= outcome.execution_time_s < TIMEOUT_BOUND_S
    assert time.monotonic() - started < TIMEOUT_BOUND_S + 2


def test_writing_gigabytes_to_disk_stops_at_the_scratch_limit():
    seen = _attack('''
def one_file():
    with open("/tmp/big", "wb") as handle:
        for _ in range(2**10):
            handle.write(b"x" * 2**20)
def many_files():
    for index in range(2**10):
        with open(f"/tmp/part-{index}", "wb") as handle:
            handle.write(b"x" * 2**19)
def grade(sample, item):
    found = {"one_file": probe(one_file)}
    os.remove("/tmp/big")
    found["many_files"] = probe(many_files)
    for path in ("/usr/x", "/x", "/dev/x", "/sandbox/x"):
        found[path] = probe(lambda path=path: open(path, "wb").close())
    report(**found)
''')
    assert seen["one_file"] == "EFBIG"  # RLIMIT_FSIZE
    assert seen["many_files"] == "ENOSPC"  # the tmpfs's size
    assert [seen[path] for path in ("/usr/x", "/x", "/dev/x", "/sandbox/x")] == ["EROFS"] * 4


def test_a_flood_on_stdout_never_reaches_the_protocol():
    source = '''import os, sys
def grade(sample, item):
    print('{"id": 1, "score": 1.0}')
    print('{"hello": 1}', file=sys.stderr)
    chunk = "x" * 2**20
    for _ in range(2**10):
        print(chunk)
        os.write(1, b'{"id": 2, "score": 1.0}\\n')
    return 0.25
'''
    outcomes = _run(source, calls=2)
    assert [outcome.score for outcome in outcomes] == [0.25, 0.25]


def test_lines_forged_on_the_protocol_pipe_stay_the_graders_own():
    # a grader can find the real pipe (/proc/self/fd); what it writes there can only be its own
    # score, never the platform's error, and a line over the bound ends its process
    source = '''import os
def grade(sample, item):
    for fd in os.listdir("/proc/self/fd") if item["line"] else ():
        try:
            os.write(int(fd), item["line"].encode() + b"\\n")
        except OSError:
            pass
    return 0.5
'''
    forged_error = json.dumps({"id": 1, "error": "sandbox_error", "details": "the platform failed"})
    with PythonSandbox(source, limits=LIMITS) as sandbox:
        outcomes = sandbox.grade_many([(SAMPLE, {"line": forged_error}), (SAMPLE, {"line": "x" * (128 << 10)}),
                                       (SAMPLE, {"line": ""})])
    assert [outcome.error for outcome in outcomes] == ["runtime_error", "output_too_large", None]
    assert outcomes[0].details == "the grader's process answered out of protocol"
    assert outcomes[2].score == 0.5  # a fresh process after the oversized line


def test_the_system_call_filter_refuses_what_namespaces_need_not_allow():
    column = sandbox_seccomp.MACHINES.index(platform.machine())
    numbers = {name: sandbox_seccomp.DENIED[name][column] for name in
               ("ptrace", "mount", "unshare", "setns", "keyctl", "bpf", "perf_event_open", "userfaultfd",
                "io_uring_setup", "shmget")}
    seen = _attack('''
import ctypes, threading
libc = ctypes.CDLL(None, use_errno=True)
def call(number):
    ctypes.set_errno(0)
    result = libc.syscall(number, 0x10000000, 0, 0, 0, 0)
    return errno.errorcode.get(ctypes.get_errno(), "none") if result == -1 else "done"
def grade(sample, item):
    found = {name: call(number) for name, number in NUMBERS.items()}
    with open("/proc/self/status") as handle:
        status = dict(line.split(":", 1) for line in handle.read().splitlines())
    found.update({key: status[key].strip() for key in ("Seccomp", "NoNewPrivs", "CapEff")})
    worker = threading.Thread(target=lambda: None)
    found["thread"] = probe(lambda: (worker.start(), worker.join()))
    report(**found)
''', NUMBERS=numbers)
    assert {name: seen[name] for name in numbers} == dict.fromkeys(numbers, "EPERM")
    assert (seen["Seccomp"], seen["NoNewPrivs"], seen["CapEff"]) == ("2", "1", "0000000000000000")
    assert seen["thread"] == "done"  # clone3 refused with ENOSYS: the C library falls back to clone


def test_through_the_api_a_hostile_grader_is_contained_and_a_burst_gets_429(tmp_path, database_url):
    """Tenant A's fork bomb and endless loop answer 200 with their error flags while tenant B's
    grader scores; over the server's sandbox slots the answer is 429 with Retry-After."""
    import threading

    import openai
    from fastapi.testclient import TestClient

    from tests.helpers.net import wait_until
    from tests.helpers.platform import add_tenant, make_platform
    from tuneforge.api.app import create_app

    plane = make_platform(tmp_path, database_url, grader_sandboxes=2, grader_timeout_s=3.0)
    http = TestClient(create_app(platform=plane), raise_server_exceptions=False)
    keys = {name: add_tenant(plane, name) for name in ("alpha", "beta")}

    def run(key: str, source: str) -> object:
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0)
        return sdk.fine_tuning.alpha.graders.run(grader={"type": "python", "name": "g", "source": source},
                                                 model_sample="abc", item={"n": 4})

    try:
        bomb = run(keys["alpha"], "import os\ndef grade(sample, item):\n    while True:\n        os.fork()\n")
        assert bomb.reward == 0 and bomb.metadata.errors.python_grader_runtime_error
        answers: dict[str, object] = {}
        endless = threading.Thread(target=lambda: answers.update(
            endless=run(keys["alpha"], "def grade(sample, item):\n    while True:\n        pass\n")))
        endless.start()
        try:
            wait_until(lambda: _slots_held(plane) == 1, timeout_s=30, what="the endless grader to start")
            fine = run(keys["beta"], "def grade(sample, item):\n    return len(sample['output_text']) / item['n']\n")
            assert fine.reward == 0.75 and not fine.metadata.errors.python_grader_runtime_error
            endless_too = threading.Thread(target=lambda: answers.update(
                second=run(keys["alpha"], "def grade(sample, item):\n    while True:\n        pass\n")))
            endless_too.start()
            wait_until(lambda: _slots_held(plane) == 2, timeout_s=30, what="the second endless grader to start")
            with pytest.raises(openai.RateLimitError) as caught:
                run(keys["beta"], "def grade(sample, item):\n    return 1\n")
            assert caught.value.response.headers["Retry-After"] and caught.value.body["code"] == "too_many_graders"
            endless_too.join(timeout=60)
        finally:
            endless.join(timeout=60)
        for name in ("endless", "second"):
            assert answers[name].reward == 0 and answers[name].metadata.errors.unresponsive_reward_error
    finally:
        http.close()
        plane.db.dispose()


def _slots_held(plane) -> int:  # noqa: ANN001 - a Platform
    from tuneforge.services.training import graders as grader_service

    return grader_service._slots_held.get(id(plane.settings), 0)

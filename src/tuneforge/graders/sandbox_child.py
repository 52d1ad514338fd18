"""The program that runs inside the python-grader sandbox (`sandbox_process.py` starts it in bwrap).

It runs on the operating system's python, standard library only, and is the one file of the
platform the sandbox holds. It speaks JSON lines with the platform on the pipes it was started
with (its stdin and stdout):

    child -> {"hello": 1}                              it started
    parent -> {"source": "..."}                        the tenant's grader
    child -> {"loaded": true}  or  {"error": ..., "details": ...}
    parent -> {"id": n, "sample": {...}, "item": {...}}   (repeated)
    child -> {"id": n, "score": x, "cpu_s": t}  or  {"id": n, "error": ..., "details": ..., "cpu_s": t}

Before any tenant code runs, the protocol's pipes are moved to new descriptors and the standard
ones (0, 1, 2) point at /dev/null: whatever the tenant prints, or writes to fd 1, or a process it
starts writes, never reaches the platform as an answer. Nothing here is a security boundary (the
tenant can find and write the protocol's descriptors on purpose, or patch this module): the
sandbox is the boundary, and the platform checks every answer it reads.
"""

import builtins
import json
import math
import os
import signal
import sys
import time

DETAILS_CHARS = 500  # longest `details` sent back (tenant-visible)
REAP_ROUNDS = 8  # kill(-1) rounds after a call: a process forked during one round dies in the next


def _describe(exc):
    """`Type: message`, bounded; the message is the tenant's own object, so its str() may fail."""
    try:
        message = str(exc)
    except BaseException:  # a tenant's __str__ may raise anything
        message = "<unprintable message>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text[:DETAILS_CHARS]


def _kill_the_rest():
    """Ends every other process of the sandbox (what the tenant forked), and reaps them.

    This process is pid 1 of the sandbox's pid namespace, which holds nothing but it and what the
    tenant started: kill(-1) reaches all of those, and this process, their reaper, collects them.
    No forked process outlives the call that made it, nor counts against the next one's limit.
    """
    for _ in range(REAP_ROUNDS):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            break
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def _number(value):
    """(score, None) for a finite number (bool counts: True is 1.0), else (None, why not)."""
    if not isinstance(value, (int, float)):
        return None, f"grade returned {type(value).__name__}, not a number"
    try:
        score = float(value)
    except BaseException as exc:  # an int too large for a float, a subclass's __float__
        return None, f"grade returned a number that is not a float: {_describe(exc)}"
    if not math.isfinite(score):
        return None, f"grade returned {score}, not a finite number"
    return score, None


def _load(source, main_pid):
    """The tenant's `grade`, or the answer that says why there is none."""
    try:
        code = compile(source, "<grader>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return None, {"error": "syntax_error", "details": f"line {exc.lineno}: {exc.msg}"[:DETAILS_CHARS]}
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting too deep
        return None, {"error": "syntax_error", "details": _describe(exc)}
    namespace = {"__name__": "grader", "__builtins__": builtins}
    failure = None
    try:
        exec(code, namespace)
    except MemoryError:
        failure = "memory_error"
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are the tenant's too
        failure = {"error": "runtime_error", "details": _describe(exc)}
    finally:
        if os.getpid() != main_pid:
            os._exit(0)  # a process the tenant forked at import time never speaks the protocol
    _kill_the_rest()
    if failure == "memory_error":
        return None, {"error": "memory_error", "details": "MemoryError while loading the grader"}
    if failure is not None:
        return None, failure
    grade = namespace.get("grade")
    if not callable(grade):
        return None, {"error": "runtime_error", "details": "the source defines no callable grade(sample, item)"}
    return grade, None


def _grade(grade, sample, item, main_pid):
    """One call of the tenant's grade: {"score": x} or {"error": ..., "details": ...}."""
    value = None
    failure = None
    try:
        value = grade(sample, item)
    except MemoryError:
        # nothing is built here: the traceback still holds what filled the memory
        failure = "memory_error"
    except BaseException as exc:  # whatever the tenant raises is its error
        failure = {"error": "runtime_error", "details": _describe(exc)}
    finally:
        if os.getpid() != main_pid:
            os._exit(0)
    _kill_the_rest()
    if failure == "memory_error":
        return {"error": "memory_error", "details": "MemoryError: the grader ran out of memory"}
    if failure is not None:
        return failure
    score, why_not = _number(value)
    if why_not is not None:
        return {"error": "non_number", "details": why_not[:DETAILS_CHARS]}
    return {"score": score}


class _Protocol:
    """The protocol's pipes, moved off fds 0 and 1 before the tenant's code can touch them."""

    def __init__(self):
        self._requests = os.fdopen(os.dup(0), "rb")
        self._answers_fd = os.dup(1)
        # what the tenant writes to the standard streams (and fds 0-2 that its processes inherit)
        null_fd = os.open(os.devnull, os.O_RDWR)
        for standard_fd in (0, 1, 2):
            os.dup2(null_fd, standard_fd)
        os.close(null_fd)
        # kept by reference: the tenant's code may replace json.dumps or os.write in its module
        self._dumps = json.dumps
        self._loads = json.loads
        self._write = os.write

    def send(self, message):
        data = memoryview((self._dumps(message) + "\n").encode())
        while data:
            data = data[self._write(self._answers_fd, data):]

    def receive(self):
        line = self._requests.readline()
        return self._loads(line) if line else None


def main():
    protocol = _Protocol()
    main_pid = os.getpid()
    protocol.send({"hello": 1})
    first = protocol.receive()
    if first is None:
        return
    grade, failure = _load(first["source"], main_pid)
    if failure is not None:
        protocol.send(failure)
        return
    protocol.send({"loaded": True})
    while True:
        request = protocol.receive()
        if request is None:
            return
        answer = _grade(grade, request["sample"], request["item"], main_pid)
        answer["id"] = request["id"]
        answer["cpu_s"] = time.process_time()
        protocol.send(answer)


if __name__ == "__main__":
    sys.exit(main())

"""The python-grader sandbox's seccomp filter: a classic BPF program, built here by hand.

Defence in depth behind bubblewrap's namespaces: the system calls a grader has no use for and that
attack the kernel or the namespaces (tracing, mounting, new namespaces, keyrings, eBPF, io_uring,
kernel modules, other processes' memory, file handles) or hold memory past the rlimits (System V
IPC) fail with EPERM; a socket other than AF_UNIX
fails with EPERM (the network namespace is empty anyway); clone() asking for a new namespace fails
with EPERM and clone3() (whose flags a filter cannot read) with ENOSYS, which makes the C library
fall back to clone(). Everything else is allowed. A system call of any architecture but x86-64
and AArch64 (a 32-bit one on a 64-bit kernel included) kills the process; an x32 one fails (EPERM).

bwrap reads the program (`struct sock_filter[]`) from a file descriptor (`--seccomp FD`) and loads
it, with no_new_privs, right before it executes the interpreter.
"""

from __future__ import annotations

import errno
import struct

# (x86-64, AArch64) numbers, from the kernels' unistd tables (asm/unistd_64.h, asm-generic/unistd.h)
DENIED = {
    "ptrace": (101, 117),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "unshare": (272, 97),
    "setns": (308, 268),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    # the new mount API reaches what mount() does
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    # System V IPC: a shared memory segment outlives its detach, so memory the address-space
    # limit no longer counts could pile up until the sandbox ends; the standard library uses none
    "shmget": (29, 194),
    "shmat": (30, 196),
    "shmctl": (31, 195),
    "shmdt": (67, 197),
    "msgget": (68, 186),
    "msgsnd": (69, 189),
    "msgrcv": (70, 188),
    "msgctl": (71, 187),
    "semget": (64, 190),
    "semop": (65, 193),
    "semctl": (66, 191),
    "semtimedop": (220, 192),
}
CHECKED = {  # allowed or not by their arguments
    "socket": (41, 198),
    "clone": (56, 220),
    "clone3": (435, 435),
}
ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_* of each column, in order
MACHINES = ("x86_64", "aarch64")  # platform.machine() of the hosts the filter knows

X32_SYSCALL_BIT = 0x40000000  # x86-64's x32 ABI: the same arch value, its own numbers
AF_UNIX = 1
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian
# on both architectures, so an argument's low 32 bits come first)
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16

BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K = 0x15, 0x35, 0x45  # BPF_JMP | op | BPF_K
BPF_RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000

Instruction = tuple  # ("ld", offset) | ("jeq"|"jge"|"jset", k, then, else) | ("ret", value) | ("label", name)


def _source() -> list[Instruction]:
    """The filter, with named jump targets (None: the next instruction)."""
    code: list[Instruction] = [("ld", ARCH_OFFSET)]
    for position, (arch, audit_arch) in enumerate(ARCHES.items()):
        last = position == len(ARCHES) - 1
        code.append(("jeq", audit_arch, arch, "kill" if last else None))
    for column, arch in enumerate(ARCHES):
        code += [("label", arch), ("ld", NR_OFFSET)]
        if arch == "x86_64":
            code.append(("jge", X32_SYSCALL_BIT, "eperm", None))
        code += [("jeq", numbers[column], "eperm", None) for numbers in DENIED.values()]
        code += [("jeq", CHECKED["socket"][column], "socket", None),
                 ("jeq", CHECKED["clone"][column], "clone", None),
                 ("jeq", CHECKED["clone3"][column], "enosys", "allow")]
    return code + [
        ("label", "socket"), ("ld", ARG0_OFFSET), ("jeq", AF_UNIX, "allow", "eperm"),
        ("label", "clone"), ("ld", ARG0_OFFSET), ("jset", CLONE_NAMESPACES, "eperm", "allow"),
        ("label", "allow"), ("ret", RET_ALLOW),
        ("label", "eperm"), ("ret", RET_ERRNO | errno.EPERM),
        ("label", "enosys"), ("ret", RET_ERRNO | errno.ENOSYS),
        ("label", "kill"), ("ret", RET_KILL_PROCESS),
    ]


def _assemble(code: list[Instruction]) -> bytes:
    """struct sock_filter {u16 code; u8 jt; u8 jf; u32 k} per instruction; jumps are forward offsets."""
    labels: dict[str, int] = {}
    body: list[Instruction] = []
    for instruction in code:
        if instruction[0] == "label":
            labels[instruction[1]] = len(body)
        else:
            body.append(instruction)

    def offset(target: str | None, position: int) -> int:
        if target is None:
            return 0
        distance = labels[target] - position - 1
        if not 0 <= distance <= 255:
            raise ValueError(f"seccomp jump to {target} out of range ({distance})")
        return distance

    opcodes = {"jeq": BPF_JEQ_K, "jge": BPF_JGE_K, "jset": BPF_JSET_K}
    program = bytearray()
    for position, instruction in enumerate(body):
        kind = instruction[0]
        if kind == "ld":
            program += struct.pack("=HBBI", BPF_LD_W_ABS, 0, 0, instruction[1])
        elif kind == "ret":
            program += struct.pack("=HBBI", BPF_RET_K, 0, 0, instruction[1])
        else:
            _, k, then, otherwise = instruction
            program += struct.pack("=HBBI", opcodes[kind], offset(then, position), offset(otherwise, position), k)
    return bytes(program)


_program: bytes | None = None


def program() -> bytes:
    """The filter's bytes, as bwrap's --seccomp reads them."""
    global _program
    if _program is None:
        _program = _assemble(_source())
    return _program

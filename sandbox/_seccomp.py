"""A small seccomp denylist for the process backend, as raw classic-BPF for `bwrap --seccomp FD`.

It is defence in depth on top of the namespaces: it refuses the syscalls that give kernel attack
surface or a way to rearrange the sandbox (new namespaces, mounts, ptrace, bpf, keyrings, io_uring,
userfaultfd, perf, module/kexec loading, TIOCSTI). Refused calls fail with EPERM (clone3 with ENOSYS,
so libc falls back to clone, whose flags we can inspect). Only x86_64 has a table; elsewhere
`program()` returns None and the sandbox runs without the filter (the README says so).
"""

from __future__ import annotations

import errno
import platform
import struct

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000

# x86_64 syscall numbers refused outright
_X86_64_DENY = {
    "ptrace": 101,
    "syslog": 103,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "pivot_root": 155,
    "init_module": 175,
    "delete_module": 176,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
_X86_64_CLONE, _X86_64_CLONE3, _X86_64_IOCTL = 56, 435, 16

# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C

# offsets in struct seccomp_data
_OFF_NR, _OFF_ARCH, _OFF_ARG0, _OFF_ARG1 = 0, 4, 16, 24


def _assemble(prog: list[tuple]) -> bytes:
    """prog: (op, k) or (op, k, true_label, false_label) or ("label", name); labels become offsets."""
    labels, pc = {}, 0
    for ins in prog:
        if ins[0] == "label":
            labels[ins[1]] = pc
        else:
            pc += 1
    out, pc = [], 0
    for ins in prog:
        if ins[0] == "label":
            continue
        op, k = ins[0], ins[1]
        jt = jf = 0
        if len(ins) == 4:
            jt = 0 if ins[2] is None else labels[ins[2]] - pc - 1
            jf = 0 if ins[3] is None else labels[ins[3]] - pc - 1
            if not (0 <= jt <= 255 and 0 <= jf <= 255):
                raise ValueError("seccomp program jump out of range")
        out.append(struct.pack("=HBBI", op, jt, jf, k))
        pc += 1
    return b"".join(out)


def program() -> bytes | None:
    """The filter for this machine's architecture, or None where there is no table."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    prog: list[tuple] = [
        (_LD_W_ABS, _OFF_ARCH),
        (_JEQ_K, _AUDIT_ARCH_X86_64, "arch_ok", None),
        (_RET_K, _RET_KILL_PROCESS),
        ("label", "arch_ok"),
        (_LD_W_ABS, _OFF_NR),
        (_JGE_K, _X32_BIT, "eperm", None),  # the x32 ABI: refuse it all
    ]
    for nr in sorted(_X86_64_DENY.values()):
        prog.append((_JEQ_K, nr, "eperm", None))
    prog += [
        (_JEQ_K, _X86_64_CLONE, "clone", None),
        (_JEQ_K, _X86_64_CLONE3, "enosys", None),
        (_JEQ_K, _X86_64_IOCTL, "ioctl", None),
        (_RET_K, _RET_ALLOW),
        ("label", "clone"),
        (_LD_W_ABS, _OFF_ARG0),
        (_JSET_K, _CLONE_NS_FLAGS, "eperm", None),
        (_RET_K, _RET_ALLOW),
        ("label", "ioctl"),
        (_LD_W_ABS, _OFF_ARG1),
        (_JEQ_K, _TIOCSTI, "eperm", None),
        (_JEQ_K, _TIOCLINUX, "eperm", None),
        (_RET_K, _RET_ALLOW),
        ("label", "eperm"),
        (_RET_K, _RET_ERRNO | errno.EPERM),
        ("label", "enosys"),
        (_RET_K, _RET_ERRNO | errno.ENOSYS),
    ]
    return _assemble(prog)


DENIED_SYSCALLS = tuple(sorted(_X86_64_DENY)) + ("clone/unshare with namespace flags", "clone3", "ioctl TIOCSTI")

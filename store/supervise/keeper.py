"""The keeper: the program between the store and every child it starts (supervise/procs.py says why).

Run by the store's interpreter as a script, `python -I -S keeper.py FD CGROUP EXE ARGV0 ARGS...`,
never imported: it must start fast (an interpreter start and C modules only: no `signal`, no
`ctypes`, which import enum, struct and more) and must not see the store's package or the user's
site-packages. FD is its end of the store's socketpair; CGROUP is the cgroup v2 directory to join
before anything else ("" for none; "self" for the one it already runs in: a systemd scope).

    keeper (own session: its pid is the process group)   [in its own cgroup when it has one]
      └─▶ the command (PR_SET_PDEATHSIG(SIGKILL), bound to the keeper) └─▶ its children …

- The command exits: its exit status goes on the socket; the keeper keeps waiting.
- The socket reaches EOF (the store is done with it, or died — the kernel closes a dead process's
  descriptors, SIGKILL included): the keeper kills everything it started. With a cgroup that is
  one write of "1" to its `cgroup.kill`: the kernel kills every process in it, the keeper
  included, atomically — a descendant that keeps forking (fork, parent exits, repeat) and left
  the process group with setsid cannot outrun it, since a fork into a dying cgroup is killed
  too. Without one, the keeper is a child subreaper (orphans below it are reparented to it, never
  to init), walks /proc for every live process whose parent chain reaches it and SIGKILLs those
  (pinned by a pidfd, reaping and walking again, at most 5 s), then SIGKILLs its process group.
"""

import os
import select
import sys

SIGKILL, SIGPIPE, SIGXFSZ = 9, 13, 25  # Linux's numbers (the store runs on Linux only)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:  # typeshed types the signal module only; _signal is the same functions
    import signal as _signal
else:
    try:
        import _signal
    except ImportError:
        _signal = None


def _prctl():
    try:
        import _ctypes

        class _int(_ctypes._SimpleCData):
            _type_ = "i"

        class _Fn(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = _int

        class _Libc:  # what CFuncPtr reads of a CDLL: its handle (typeshed wants a path and a CDLL)
            _handle = _ctypes.dlopen(None)  # type: ignore[arg-type]  # None: the program and its libc

        return _Fn(("prctl", _Libc))  # type: ignore[arg-type]
    except Exception:
        try:
            import ctypes
            return ctypes.CDLL(None, use_errno=True).prctl
        except Exception:  # no ctypes: the group kill below still reaches the command
            return None


def own_cgroup():
    """This process's cgroup v2 directory (the unified hierarchy's mount + /proc/self/cgroup's
    `0::` path), or None."""
    try:
        with open("/proc/self/cgroup", "rb") as f:
            rel = next((ln[3:].strip() for ln in f.read().split(b"\n") if ln.startswith(b"0::")), None)
        with open("/proc/self/mountinfo", "rb") as f:
            mounts = f.read().split(b"\n")
    except OSError:
        return None
    if rel is None:
        return None
    for ln in mounts:
        parts = ln.split(b" - ", 1)
        if len(parts) == 2 and parts[1].split(b" ", 1)[0] == b"cgroup2":
            mount = parts[0].split(b" ")[4]
            return (mount + rel).decode() if rel != b"/" else mount.decode()
    return None


def join(cgroup):
    """Move this process into `cgroup` before it starts anything; the directory it is in, or None."""
    if not cgroup:
        return None
    if cgroup == "self":
        return own_cgroup()
    try:
        fd = os.open(cgroup + "/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"%d" % os.getpid())
        finally:
            os.close(fd)
        return cgroup
    except OSError:
        return None  # the store finds it empty; the subreaper walk covers us


def kill_cgroup(cgroup):
    """SIGKILL every process of `cgroup`, this one included (does not return when it works)."""
    try:
        fd = os.open(cgroup + "/cgroup.kill", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    except OSError:
        return  # no cgroup.kill (Linux < 5.14): the walk and the group kill do it


def descendants(keeper):
    """Live processes whose parent chain reaches the keeper (read from /proc/*/stat), zombies left out."""
    parents: dict[int, list[int]] = {}
    alive = set()
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2:].split()
        if len(fields) < 2:
            continue
        parents.setdefault(int(fields[1]), []).append(int(e))
        if fields[0] not in (b"Z", b"X"):
            alive.add(int(e))
    out: list[int] = []
    todo = [keeper]
    while todo and len(out) < 100000:
        for child in parents.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return [p for p in out if p in alive]


def kill_descendants(keeper):
    """Bounded: at most 5 s, or until none is left; orphans of the killed come back to us (subreaper)."""
    import time

    deadline = time.monotonic() + 5
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        left = descendants(keeper)
        if not left or time.monotonic() >= deadline:
            return
        mine = set(left) | {keeper}
        for p in left:
            # Pinned by a pidfd, then its parent read again: a pid that died and was given to
            # someone else meanwhile is not ours to signal.
            try:
                fd = os.pidfd_open(p)
            except (AttributeError, OSError):
                fd = None
            try:
                with open(f"/proc/{p}/stat", "rb") as f:
                    raw = f.read()
                if int(raw[raw.rfind(b")") + 2:].split()[1]) not in mine:
                    continue
                if fd is not None and _signal is not None:
                    _signal.pidfd_send_signal(fd, SIGKILL)
                else:
                    os.kill(p, SIGKILL)
            except (OSError, ValueError, IndexError):
                pass
            finally:
                if fd is not None:
                    os.close(fd)
        time.sleep(0.005)


def main(argv):
    fd, cgroup, exe, args = int(argv[1]), argv[2], argv[3], argv[4:]
    cgroup = join(cgroup)  # first: everything started from here on is in it
    prctl = _prctl()
    keeper = os.getpid()
    if prctl is not None:
        prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans below us (setsid'd ones too) become ours
    pid = os.fork()
    if pid == 0:
        try:
            os.close(fd)
            if prctl is not None:
                prctl(1, SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the keeper
            if os.getppid() != keeper:  # the keeper died before prctl took effect
                os._exit(128 + SIGKILL)
            if _signal is not None:
                for sig in (SIGPIPE, SIGXFSZ):  # Python ignores them; the command gets the defaults
                    _signal.signal(sig, _signal.SIG_DFL)
            os.execv(exe, args)
        except OSError as exc:
            os.write(2, f"llmgw-store: cannot run {exe}: {exc.strerror or exc}\n".encode())
        finally:  # never fall through into the keeper's part
            os._exit(127)
    try:
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None  # before Linux 5.3: poll
        done = False
        while True:
            watch = [fd] if done or pidfd is None else [fd, pidfd]
            ready = select.select(watch, [], [], None if done or pidfd is not None else 0.05)[0]
            if fd in ready and not os.read(fd, 64):
                break  # EOF: the store is done with us, or dead
            if not done:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got:
                    done = True
                    os.write(fd, b"%d\n" % os.waitstatus_to_exitcode(status))
    finally:
        try:
            if cgroup is not None:
                kill_cgroup(cgroup)  # all at once, this keeper included
            kill_descendants(keeper)  # no cgroup (or no cgroup.kill): what left the group, reparented to us
        finally:
            os.killpg(0, SIGKILL)  # the whole group: the command, its children, this keeper


if __name__ == "__main__":
    main(sys.argv)

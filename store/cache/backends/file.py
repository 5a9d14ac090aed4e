"""`file:///dir`: a directory, local or NFS. Every access goes through directory fds opened with
O_NOFOLLOW|O_DIRECTORY: the cache root and its folders are refused when they are links (a `blobs/`
linked to /etc must not make a gc, running as root, delete or overwrite files there), and names are
used relative to those fds. A local filesystem either answers or fails for good: nothing is retried."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path

from llmgw_store.base.errors import IntegrityError, NetworkError
from llmgw_store.cache.backends.base import (
    CHUNK,
    MAX_LISTED,
    Listed,
    Opened,
    StreamingBackend,
    check_folder,
    listed,
    object_name,
)
from llmgw_store.cache.backends.retry import RetryPolicy, Watch


class FileBackend(StreamingBackend):
    def __init__(self, root: Path, policy: RetryPolicy | None = None):
        self.root = root
        self.policy = policy or RetryPolicy.from_env()

    def where(self, name: str) -> str:
        return str(self.root / name)

    def _dir_fd(self, folder: str, *, create: bool = False) -> int | None:
        """An fd of the cache root (folder "") or of one of its folders; None when absent."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        if create:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.root, 0o755)
            except FileExistsError:
                pass
        try:
            root = os.open(self.root, flags)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise IntegrityError(f"{self.root}: the cache root is a link or not a directory; refusing it") from None
            raise NetworkError(f"{self.root}: {exc.strerror}") from None
        if not folder:
            return root
        try:
            if create:
                try:
                    os.mkdir(folder, 0o755, dir_fd=root)
                except FileExistsError:
                    pass
            try:
                return os.open(folder, flags, dir_fd=root)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise IntegrityError(f"{self.root / folder}: is a link or not a directory; refusing it") from None
                raise NetworkError(f"{self.root / folder}: {exc.strerror}") from None
        finally:
            os.close(root)

    @contextmanager
    def _dir(self, folder: str, *, create: bool = False):
        fd = self._dir_fd(folder, create=create)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    @contextmanager
    def _open(self, name: str, offset: int, watch: Watch):
        path = self.root / name
        folder, _, base = name.rpartition("/")
        with self._dir(folder) as dfd:
            if dfd is None:
                yield None
                return
            try:
                # O_NONBLOCK: a FIFO planted in the cache must not hang the open; O_NOFOLLOW: a link
                # planted there must not make this process (root) read a file of its choosing.
                fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                yield None
                return
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise IntegrityError(f"{path}: is not a regular file (a link); refusing it") from None
                raise NetworkError(f"{path}: {exc.strerror}") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise IntegrityError(f"{path}: is not a regular file; refusing it")
                if offset:
                    os.lseek(fd, offset, os.SEEK_SET)
                yield Opened(st.st_size, offset, lambda n: os.read(fd, n))
            finally:
                os.close(fd)

    def put(self, name: str, src: Path | bytes) -> None:
        object_name(name)
        folder, _, base = name.rpartition("/")
        # A new file under a name nobody can guess (O_EXCL: never a FIFO, link or file planted in a
        # cache directory others can write, whose open would block or write through).
        tmp = f".{base}.{secrets.token_hex(8)}.tmp"
        with self._dir(folder, create=True) as dfd:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as out:
                    if isinstance(src, bytes):
                        out.write(src)
                    else:
                        with open(src, "rb") as f:
                            while chunk := f.read(CHUNK):
                                out.write(chunk)
                # Within one directory fd: readers see the whole object or none.
                os.replace(tmp, base, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except FileNotFoundError:
                    pass
                raise

    def size(self, name: str) -> int | None:
        folder, _, base = object_name(name).rpartition("/")
        with self._dir(folder) as dfd:
            if dfd is None:
                return None
            try:
                st = os.stat(base, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def delete(self, name: str) -> None:
        folder, _, base = object_name(name).rpartition("/")
        with self._dir(folder) as dfd:
            if dfd is None:
                return
            try:
                os.unlink(base, dir_fd=dfd)  # unlink never follows a link, and dfd is no link
            except FileNotFoundError:
                pass

    def list(self, folder: str = "") -> list[Listed]:
        """Regular files under an object name, and (regular=False) anything else under one: a
        link or a FIFO planted as a roots document must stop a cache gc, not be skipped by it."""
        where = self.root / check_folder(folder) if folder else self.root
        out: list[Listed] = []
        with self._dir(folder) as dfd:
            if dfd is None:
                return out
            with os.scandir(dfd) as it:
                for e in it:
                    if e.name.startswith("."):
                        continue
                    st = e.stat(follow_symlinks=False)
                    regular = stat.S_ISREG(st.st_mode)
                    item = listed(folder, e.name, st.st_size, st.st_mtime, regular)
                    if item is not None:
                        out.append(item)
                    if len(out) > MAX_LISTED:
                        raise IntegrityError(f"{where}: lists more than {MAX_LISTED} objects; refusing it")
        return out

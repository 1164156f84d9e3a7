"""Writing files without touching anyone else's.

Every file convprobe writes goes through here (results, tables, figures, run records,
checkpoints), for three promises:

- **What is read is checked first.** `check_input_file` refuses, in one line, a file a user
  names for convprobe to read that is missing, a directory, a FIFO or device (a reader would
  block or never end), empty, or unreadable, before any library opens it.
- **Checked before any work.** `check_output_path` and `check_directory_path` refuse, in one
  line, a path that could not be written: an empty name, a name or component too long for the
  file system, a parent that is a file or a dangling symbolic link, a directory without write
  permission, and a target that is not a regular file (a symbolic link, a device, a FIFO).
  A result computed for minutes is never lost to a path that was wrong from the start.
- **Never through a link.** `write_atomic` writes a fresh temporary file (created exclusively,
  so it cannot be a planted link) and renames it over the target; `open_append` opens with
  ``O_NOFOLLOW`` and refuses anything but a regular file. A link planted in a run directory is
  refused, never followed.
- **A failure at write time loses nothing.** A full disk or a file-size limit raises
  `OutputWriteFailed` (the CLI's exit code 3) after removing the temporary file: the previous
  file, if any, is intact.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from convprobe.errors import InvalidArgument, OutputWriteFailed, reason

__all__ = ["check_input_file", "check_model_file", "file_sha256", "check_output_path", "check_directory_path", "can_create_in", "write_atomic", "open_append",
           "refuse_links", "directory_lock", "refuse_locked", "lock_holder", "has_lock_file", "failures_as_one_line",
           "save_figure", "TEMPORARY_PREFIX", "LOCK_NAME"]

#: The prefix of the temporary files `write_atomic` creates (and may leave behind after a SIGKILL).
TEMPORARY_PREFIX = ".convprobe-"
#: The lock file of a run directory (`directory_lock`).
LOCK_NAME = ".convprobe.lock"

_PATH_MAX = 4096  # Linux's PATH_MAX; os.pathconf gives it per file system where it differs


def _name_max(directory: str) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _path_max(directory: str) -> int:
    try:
        return os.pathconf(directory, "PC_PATH_MAX")
    except (OSError, ValueError):
        return _PATH_MAX


def _first_existing(path: str) -> str:
    """`path`, or its nearest ancestor that exists (a link counts, dangling or not)."""
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def _nearest_existing(path: str, argument: str, shown: str) -> str:
    """The nearest ancestor of `path` that exists, checked to be a directory (following links);
    a parent that is a file or a dangling link is refused here, not at write time."""
    current = _first_existing(os.path.dirname(path))
    if not os.path.isdir(current):
        what = "a dangling symbolic link" if os.path.islink(current) else "not a directory"
        raise InvalidArgument(f"{argument} {shown!r} cannot be written: its parent {current!r} is {what}")
    return current


def _shorten(path: str, limit: int = 80) -> str:
    """A path for a one-line message: its repr, the middle elided when it is long."""
    return repr(path) if len(path) <= limit else repr(path[: limit // 2]) + "..." + repr(path[-limit // 2:])


def _check_path_text(path: str, argument: str) -> str:
    """The absolute form of a path, refused when empty, with a NUL byte, or too long."""
    if not isinstance(path, str) or not path.strip():
        raise InvalidArgument(f"{argument} must name a path; received {path!r}")
    if "\0" in path:
        raise InvalidArgument(f"{argument} must not contain a NUL byte; received {path!r}")
    absolute = os.path.abspath(path)
    existing = _first_existing(os.path.dirname(absolute))
    longest = _name_max(existing)
    for part in Path(absolute).parts:
        if len(os.fsencode(part)) > longest:
            raise InvalidArgument(f"{argument} has a name of {len(os.fsencode(part))} bytes; at most {longest} "
                                  f"are allowed here; received {_shorten(path)}")
    if len(os.fsencode(absolute)) >= _path_max(existing):
        raise InvalidArgument(f"{argument} is {len(os.fsencode(absolute))} bytes long as an absolute path; "
                              f"at most {_path_max(existing) - 1} are allowed; received {_shorten(path)}")
    return absolute


def check_input_file(path: str | os.PathLike, where: str, *, allow_empty: bool = False) -> Path:
    """`path` as a Path if it is a regular file (a link is followed to one) that is not empty
    (unless `allow_empty`) and can be opened for reading; otherwise one InvalidArgument line that
    starts with `where` (e.g. "--keras-model 'm.keras'"). Nothing is read: a FIFO or a device is
    refused by its type, never opened."""
    p = Path(path)
    try:
        status = p.stat()
    except FileNotFoundError:
        problem = "is a broken symbolic link" if os.path.islink(p) else "does not exist"
        raise InvalidArgument(f"{where} {problem}") from None
    except (OSError, ValueError) as exc:  # a link loop, a name too long, a NUL byte in the name
        raise InvalidArgument(f"{where} cannot be read ({reason(exc)})") from None
    if stat.S_ISDIR(status.st_mode):
        raise InvalidArgument(f"{where} is a directory, not a file")
    if not stat.S_ISREG(status.st_mode):
        raise InvalidArgument(f"{where} is not a regular file (a FIFO, socket or device)")
    if status.st_size == 0 and not allow_empty:
        raise InvalidArgument(f"{where} is empty")
    try:
        os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        raise InvalidArgument(f"{where} cannot be read ({reason(exc)})") from None
    return p


#: What Keras 3 reads as a saved model, by suffix, and the bytes such a file starts with.
MODEL_FILE_SIGNATURES = {".keras": (b"PK\x03\x04", "a zip archive"),
                         ".h5": (b"\x89HDF\r\n\x1a\n", "an HDF5 file"),
                         ".hdf5": (b"\x89HDF\r\n\x1a\n", "an HDF5 file")}


def check_model_file(path: str | os.PathLike, where: str) -> Path:
    """A saved Keras model named by a user, checked before Keras opens it (`check_input_file`,
    then its suffix and its first bytes): Keras answers 'File not found' for a file that exists
    but is empty, text or a directory, and a FIFO would block it forever."""
    p = check_input_file(path, where)
    expected = MODEL_FILE_SIGNATURES.get(p.suffix.lower())
    if expected is None:
        raise InvalidArgument(f"{where} must end in {', '.join(MODEL_FILE_SIGNATURES)} (what Keras saves a model "
                              f"as); received a name ending in {p.suffix or 'no suffix'!r}")
    signature, kind = expected
    try:
        with open(p, "rb") as handle:
            start = handle.read(len(signature))
    except OSError as exc:
        raise InvalidArgument(f"{where} cannot be read ({reason(exc)})") from None
    if start != signature:
        raise InvalidArgument(f"{where} is not a saved Keras model: a {p.suffix} file is {kind}, and this one "
                              f"starts with {start!r}")
    return p


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes: what a resumed run checks its inputs by."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_output_path(path: str, argument: str = "--output") -> None:
    """Refuse, before any work, an output file that could not be written or must not be replaced."""
    absolute = _check_path_text(path, argument)
    if path.endswith(os.sep) or os.path.isdir(absolute) and not os.path.islink(absolute):
        raise InvalidArgument(f"{argument} must be a file path; received the directory {path!r}")
    if os.path.lexists(absolute):
        _refuse_special(absolute, argument, path)
    existing = _nearest_existing(absolute, argument, path)
    if not can_create_in(existing):
        raise InvalidArgument(f"{argument} {path!r} cannot be written: {existing!r} is not a writable directory")


def check_directory_path(path: str, argument: str = "--output", *, what: str = "a run directory") -> None:
    """Refuse, before any work, a directory path that could not be created or written."""
    absolute = _check_path_text(path, argument)
    if os.path.lexists(absolute) and not os.path.isdir(absolute):
        found = "a dangling symbolic link" if os.path.islink(absolute) else "a file"
        raise InvalidArgument(f"{argument} {path!r} is {found}; it must be {what}")
    existing = absolute if os.path.isdir(absolute) else _nearest_existing(absolute, argument, path)
    if not can_create_in(existing):
        raise InvalidArgument(f"{argument} {path!r} cannot be written: {existing!r} is not a writable directory")


def _refuse_special(absolute: str, argument: str, shown: str) -> None:
    mode = os.lstat(absolute).st_mode
    if stat.S_ISLNK(mode):
        raise InvalidArgument(f"{argument} {shown!r} is a symbolic link; convprobe replaces the files it writes and "
                              f"never writes through a link: name the file itself")
    if not stat.S_ISREG(mode):
        raise InvalidArgument(f"{argument} {shown!r} is not a regular file (a device, FIFO or socket); name a "
                              f"regular file")


def refuse_links(directory: Path, names, *, argument: str = "--output") -> None:
    """Refuse a directory in which any of `names` exists as anything but a regular file: a link
    planted there (to a user's file, or a device) is refused, never followed."""
    for name in names:
        path = directory / name
        if os.path.lexists(path):
            mode = os.lstat(path).st_mode
            if not stat.S_ISREG(mode):
                what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                raise InvalidArgument(f"{argument} {str(directory)!r}: {name} is {what}; convprobe writes only its "
                                      f"own regular files there; nothing was changed: use a new directory")


def can_create_in(directory: str) -> bool:
    """Whether a file can really be created there (access() says yes to root on /proc)."""
    try:
        with tempfile.TemporaryFile(dir=directory, prefix=TEMPORARY_PREFIX + "check-"):
            return True
    except OSError:
        return False


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, content: str | bytes) -> None:
    """Write via an exclusive temporary file and a rename, so a failure never leaves half a file
    and never writes through a link. The file gets the mode a plain open() would give it (0666
    less the umask). A write that fails (disk full, file-size limit) raises `OutputWriteFailed`
    with the previous file intact."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path)) or "."
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=TEMPORARY_PREFIX, suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_umask())
        data = content.encode("utf-8") if isinstance(content, str) else content
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError as error:
        raise OutputWriteFailed(_failure(path, error)) from None
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)


def _failure(path: str, error: OSError) -> str:
    reason = error.strerror or errno.errorcode.get(error.errno or 0, type(error).__name__)
    return f"could not write {path!r}: {reason}; the previous file, if any, is unchanged"


def save_figure(figure, path: str | os.PathLike, **options) -> None:
    """A matplotlib figure written like every other file: atomically, never through a link, in
    the format its suffix names."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip(".").lower() or "png", **options)
    write_atomic(path, buffer.getvalue())


@contextmanager
def failures_as_one_line(path: str | os.PathLike):
    """Turn an OSError raised while writing `path` into `OutputWriteFailed`'s one line."""
    try:
        yield
    except OSError as error:
        raise OutputWriteFailed(_failure(os.fspath(path), error)) from None


def open_append(path: str | os.PathLike):
    """`path` opened for appending text, never through a symbolic link and only if it is (or
    becomes) a regular file; a FIFO planted there does not block the open."""
    path = os.fspath(path)
    if os.path.lexists(path) and not os.path.islink(path) and not os.path.isfile(path):
        raise InvalidArgument(f"{path} is not a regular file; convprobe writes only regular files")
    with failures_as_one_line(path):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise InvalidArgument(f"{path} is a symbolic link; convprobe never writes through one") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise InvalidArgument(f"{path} is not a regular file; convprobe writes only regular files")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a", newline="", encoding="utf-8")


def has_lock_file(directory: str | os.PathLike) -> bool:
    """Whether `directory` holds convprobe's lock file (a regular file, not a link): a convprobe
    run has held it, whether or not it got as far as writing anything else."""
    try:
        return stat.S_ISREG(os.lstat(Path(directory) / LOCK_NAME).st_mode)
    except OSError:
        return False


def lock_holder(directory: str | os.PathLike) -> str | None:
    """Who holds `directory`'s lock now, as its lock file says ("PID WHAT", or '' before the
    holder wrote it), or None when no process holds it. Changes nothing; never opens a link."""
    try:
        fd = os.open(Path(directory) / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip()
        return None
    finally:
        os.close(fd)  # releases the shared lock taken to look


def _in_use(directory: str | os.PathLike, holder: str, argument: str) -> InvalidArgument:
    """'in use by another convprobe comparison (pid 123)', from the holder's lock file."""
    pid, _, what = holder.partition(" ")
    what = what if what.startswith("convprobe ") else "convprobe run"
    shown = f" (pid {pid})" if pid.isdigit() else ""
    return InvalidArgument(f"{argument} {str(directory)!r} is in use by another {what}{shown}; nothing was "
                           f"changed: wait for it to end or use another directory")


def refuse_locked(directory: str | os.PathLike, *, argument: str = "--output") -> None:
    """Refuse, before any work, a directory whose lock another process holds, naming it."""
    holder = lock_holder(directory)
    if holder is not None:
        raise _in_use(directory, holder, argument)


@contextmanager
def directory_lock(directory: str | os.PathLike, *, argument: str = "--output", what: str = "convprobe run"):
    """Hold an exclusive lock on a directory for the length of a run: a second writer is one
    InvalidArgument line naming the holder (`what` and its pid, which the lock file holds), before
    it changes anything. The lock is the kernel's (flock), so it goes with the process, even on
    SIGKILL. A run refused inside the lock leaves no lock file it created, and no directory it
    created."""
    directory = Path(directory)
    created = _missing_ancestors(directory)
    with failures_as_one_line(directory):
        directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    refuse_links(directory, [LOCK_NAME], argument=argument)
    new = not os.path.lexists(path)
    fd = _locked_descriptor(path, directory, argument, what)
    try:
        yield
    except InvalidArgument:
        if new:
            os.unlink(path)
            for folder in created:  # the deepest first; a folder holding anything else stays
                try:
                    folder.rmdir()
                except OSError:
                    break
        raise
    finally:
        os.close(fd)


def _missing_ancestors(directory: Path) -> list[Path]:
    """`directory` and its ancestors that do not exist yet, the deepest first."""
    missing = []
    current = Path(os.path.abspath(directory))
    while not os.path.lexists(current):
        missing.append(current)
        current = current.parent
    return missing


def _locked_descriptor(path: Path, directory: Path, argument: str, what: str) -> int:
    """An open descriptor of the lock file, locked; the file is checked to be the one at `path`
    after locking, since a refused run may remove a lock file it had created."""
    while True:
        with failures_as_one_line(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise _in_use(directory, holder, argument) from None
        current = os.stat(path, follow_symlinks=False) if os.path.lexists(path) else None
        opened = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {what}".encode(), 0)
            return fd
        os.close(fd)  # locked a file that was removed meanwhile: open the one there now

"""Every file Espresso reads or writes goes through here.

Reading turns OS and decoding errors into the caller's error type with one shape,
``<what>: <file>: <reason>``; writing is atomic (a temporary file in the target's folder,
then a rename), so a reader never sees half a file and a failed write leaves the old one.
``check_writable`` lets a command refuse a bad output path *before* it spends time on work
whose result it could not save.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from .errors import EspressoError


class FileError(EspressoError, OSError):
    """A file could not be read or written; the message names it and why."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file or directory"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, expected a file"
    if isinstance(exc, NotADirectoryError):
        return "a part of the path is not a directory"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    if isinstance(exc, UnicodeDecodeError):
        return (f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                "expected a UTF-8 YAML/JSON file")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


def _fail(what: str, path: str | Path, exc: BaseException, err: type[Exception]) -> Exception:
    msg = f"{what}: {shown_path(path)}: {_reason(exc)}"
    return err(msg)


def shown_path(path: str | Path) -> str:
    """The path as messages show it: a name of thousands of characters is cut."""
    text = os.fspath(path)
    return text if len(text) <= 200 else f"{text[:80]}...({len(text):,} characters)"


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words, for messages."""
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return words
    return "not a regular file"


def _not_regular(what: str, path: str | Path, mode: int, err: type[Exception]) -> Exception:
    if stat.S_ISDIR(mode):
        return err(f"{what}: {shown_path(path)}: is a directory, expected a file")
    return err(f"{what}: {shown_path(path)}: is {kind_of(mode)}, expected a regular file")


def _check_path(what: str, path: str | Path, err: type[Exception]) -> None:
    if isinstance(path, str) and not path:
        msg = f"{what}: an empty path; expected a file name"
        raise err(msg)


MAX_INPUT_BYTES = 8 * 1024 * 1024
"""Input files larger than this are refused: a catalog, job, plan or profile is kilobytes
(the built-in catalog 6 KB, a plan 2-40 KB), and YAML parses at about 1 MB/s, so a hostile
file cannot hold a command for more than seconds."""


def read_bytes(what: str, path: str | Path, *, err: type[Exception] = FileError,
               max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``).

    Anything else is refused before a byte is read: a FIFO or a terminal would block, a
    device like ``/dev/zero`` never ends. The file is opened without blocking and checked
    on the open descriptor, so it cannot be swapped for a FIFO in between."""
    _check_path(what, path, err)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:
        mode = stat.S_IFREG
        with contextlib.suppress(OSError, ValueError):
            mode = os.stat(path).st_mode  # a socket cannot be opened: say what it is
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            raise _not_regular(what, path, mode, err) from None
        raise _fail(what, path, exc, err) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(what, path, st.st_mode, err)
        if st.st_size > max_bytes:
            msg = (f"{what}: {shown_path(path)}: {st.st_size:,} bytes is too large "
                   f"(at most {max_bytes:,})")
            raise err(msg)
        chunks = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > max_bytes:  # grew while being read
                msg = f"{what}: {shown_path(path)}: more than {max_bytes:,} bytes"
                raise err(msg)
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        if isinstance(exc, err):
            raise
        raise _fail(what, path, exc, err) from None
    finally:
        os.close(fd)


def read_text(what: str, path: str | Path, *, err: type[Exception] = FileError,
              max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of ``path``; errors name ``what`` (e.g. ``catalog``) and the file."""
    data = read_bytes(what, path, err=err, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(what, path, exc, err) from None


def exists(path: str | Path) -> bool:
    """``os.path.exists`` that says ``False`` for names too long to exist."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


_SafeBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present


class DuplicateKeyError(yaml.YAMLError, ValueError):  # type: ignore[misc]
    """A mapping names one key twice (YAML and JSON parsers would keep the last silently)."""


class _Loader(_SafeBase):  # type: ignore[misc,valid-type]
    """PyYAML's safe loader, reading ``1e-3`` and ``2E10`` as numbers as well: YAML 1.1 (what
    PyYAML follows) wants a dot in the mantissa and would read them as strings. A key given
    twice in one mapping is an error, not "the last wins"."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<:` merges; explicit keys may override merged ones
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:
                    continue  # an unhashable key: the base class reports it
                if dup:
                    mark = key_node.start_mark
                    msg = (f"duplicate key {key!r} (line {mark.line + 1}, column "
                           f"{mark.column + 1}); each key may appear once")
                    raise DuplicateKeyError(msg)
        return super().construct_mapping(node, deep=deep)


_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    """YAML (or JSON) text to Python objects, scientific notation read as numbers. JSON
    documents take the (much faster) JSON parser; YAML is a superset, so the result is the
    same."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            return loads_json(text)
        except DuplicateKeyError:
            raise
        except (ValueError, RecursionError):
            pass  # YAML flow style, or not valid at all: the YAML parser says which
    return yaml.load(text, Loader=_Loader)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in pairs:
        if key in out:
            msg = f"duplicate key {key!r}; each key may appear once"
            raise DuplicateKeyError(msg)
        out[key] = val
    return out


def loads_json(text: str) -> Any:
    """``json.loads`` that refuses a key given twice in one object
    (:class:`DuplicateKeyError`)."""
    return json.loads(text, object_pairs_hook=_unique_pairs)


def load_yaml(what: str, path: str | Path, *, err: type[Exception] = FileError) -> Any:
    """Parse a YAML (or JSON) file; errors name ``what``, the file and the reason."""
    text = read_text(what, path, err=err)
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        msg = f"{what}: {shown_path(path)}: cannot parse as YAML/JSON: {exc}"
        raise err(msg) from None
    except RecursionError:
        msg = f"{what}: {shown_path(path)}: nested too deeply to parse"
        raise err(msg) from None


def check_writable(what: str, path: str | Path, *, err: type[Exception] = FileError) -> Path:
    """Refuse, before any work, an output path that cannot be written, and return the file
    that will be written: ``path`` itself, or for a symlink the file it points to (written
    through, the link kept).

    Outputs are regular files only: a directory, FIFO, socket or device is refused by name
    (an atomic write would replace it with a file), as is a path whose folder is missing or
    not a folder, or a folder without write permission."""
    _check_path(what, path, err)
    shown = shown_path(path)
    try:
        target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        raise _fail(what, path, exc, err) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            msg = f"{what}: {shown}: is a directory, expected a file name"
        else:
            msg = (f"{what}: {shown}: is {kind_of(st.st_mode)}; outputs are written to "
                   "regular files only")
        raise err(msg)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.exists():
        msg = f"{what}: {shown}: the folder {shown_path(parent)!r} does not exist"
        raise err(msg)
    if not parent.is_dir():
        msg = f"{what}: {shown}: {shown_path(parent)!r} is not a folder"
        raise err(msg)
    if not os.access(parent, os.W_OK | os.X_OK):
        msg = f"{what}: {shown}: cannot write in {shown_path(parent)!r}"
        raise err(msg)
    return target


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once at import (os.umask can only be read by setting it, which is not thread-safe):
# atomic writes give files the permissions a plain open() would.
_UMASK = _read_umask()


@contextlib.contextmanager
def atomic_output(what: str, path: str | Path, *, mode: int | None = None, suffix: str = "",
                  err: type[Exception] = FileError) -> Iterator[Path]:
    """A temporary path beside the output ``path`` for a writer (e.g. ``savefig``) to fill;
    when the block ends without an error it is renamed over the output (through a symlink,
    onto the file the link names), else removed. ``suffix`` keeps the extension that tells a
    writer the format. Permissions: ``mode``, else an existing output's, else the umask's."""
    target = check_writable(what, path, err=err)
    parent = target.parent if str(target.parent) else Path(".")
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=f".tmp{suffix}",
                                   dir=parent)
        os.close(fd)
        yield Path(tmp)
        if mode is None:
            try:
                mode = stat.S_IMODE(os.stat(target).st_mode)
            except OSError:
                mode = 0o666 & ~_UMASK
        os.chmod(tmp, mode)
        check_writable(what, path, err=err)  # still a regular file (or nothing) to replace
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        if isinstance(exc, err):
            raise
        raise _fail(what, path, exc, err) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_text(what: str, path: str | Path, text: str, *, mode: int | None = None,
               err: type[Exception] = FileError) -> None:
    """Write ``text`` to ``path`` atomically (temporary file + rename; see
    :func:`atomic_output`)."""
    with atomic_output(what, path, mode=mode, err=err) as tmp, \
            open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def check_dir(what: str, path: str | Path, *, err: type[Exception] = FileError) -> None:
    """Refuse, before any work, an output folder that exists as something else, or whose
    nearest existing parent is not a folder this process can write in."""
    _check_path(what, path, err)
    p = Path(path)
    if os.path.lexists(p) and not p.is_dir():
        msg = f"{what}: {shown_path(path)}: exists and is not a folder"
        raise err(msg)
    parent = p
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        msg = f"{what}: {shown_path(path)}: cannot create or write in it"
        raise err(msg)


def make_dir(what: str, path: str | Path, *, err: type[Exception] = FileError) -> Path:
    """Create a folder (and its parents) for outputs; refuse a path that is a file."""
    _check_path(what, path, err)
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            msg = f"{what}: {shown_path(path)}: exists and is not a folder"
            raise err(msg)
        p.mkdir(parents=True, exist_ok=True)
        if not os.access(p, os.W_OK | os.X_OK):
            msg = f"{what}: {shown_path(path)}: cannot write in this folder"
            raise err(msg)
    except OSError as exc:
        if isinstance(exc, err):
            raise
        raise _fail(what, path, exc, err) from None
    return p

"""Every file Espresso reads or writes goes through here.

Reading turns OS and decoding errors into the caller's error type with one shape,
``<what>: <file>: <reason>``; writing is atomic (a temporary file in the target's folder,
then a rename), so a reader never sees half a file and a failed write leaves the old one.
``check_writable`` lets a command refuse a bad output path *before* it spends time on work
whose result it could not save.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
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
    if isinstance(exc, UnicodeDecodeError):
        return (f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                "expected a UTF-8 YAML/JSON file")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


def _fail(what: str, path: str | Path, exc: BaseException, err: type[Exception]) -> Exception:
    msg = f"{what}: {os.fspath(path)}: {_reason(exc)}"
    return err(msg)


MAX_INPUT_BYTES = 8 * 1024 * 1024
"""Input files larger than this are refused: a catalog, job, plan or profile is kilobytes
(the built-in catalog 6 KB, a plan 2-40 KB), and YAML parses at about 1 MB/s, so a hostile
file cannot hold a command for more than seconds."""


def read_text(what: str, path: str | Path, *, err: type[Exception] = FileError) -> str:
    """The UTF-8 text of ``path``; errors name ``what`` (e.g. ``catalog``) and the file."""
    try:
        p = Path(path)
        size = p.stat().st_size
        if size > MAX_INPUT_BYTES:
            msg = (f"{what}: {os.fspath(path)}: {size:,} bytes is too large "
                   f"(at most {MAX_INPUT_BYTES:,})")
            raise err(msg)
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, err):
            raise
        raise _fail(what, path, exc, err) from None


_SafeBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present


class _Loader(_SafeBase):  # type: ignore[misc,valid-type]
    """PyYAML's safe loader, reading ``1e-3`` and ``2E10`` as numbers as well: YAML 1.1 (what
    PyYAML follows) wants a dot in the mantissa and would read them as strings."""


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
            return json.loads(text)
        except (ValueError, RecursionError):
            pass  # YAML flow style, or not valid at all: the YAML parser says which
    return yaml.load(text, Loader=_Loader)


def load_yaml(what: str, path: str | Path, *, err: type[Exception] = FileError) -> Any:
    """Parse a YAML (or JSON) file; errors name ``what``, the file and the reason."""
    text = read_text(what, path, err=err)
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        msg = f"{what}: {os.fspath(path)}: cannot parse as YAML/JSON: {exc}"
        raise err(msg) from None
    except RecursionError:
        msg = f"{what}: {os.fspath(path)}: nested too deeply to parse"
        raise err(msg) from None


def check_writable(what: str, path: str | Path, *, err: type[Exception] = FileError) -> Path:
    """Refuse, before any work, an output path that cannot be written: a directory, a path
    whose folder is missing or not a folder, or a folder without write permission."""
    p = Path(path)
    if p.is_dir():
        msg = f"{what}: {os.fspath(path)}: is a directory, expected a file name"
        raise err(msg)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        msg = f"{what}: {os.fspath(path)}: the folder {os.fspath(parent)!r} does not exist"
        raise err(msg)
    if not parent.is_dir():
        msg = f"{what}: {os.fspath(path)}: {os.fspath(parent)!r} is not a folder"
        raise err(msg)
    if not os.access(parent, os.W_OK | os.X_OK):
        msg = f"{what}: {os.fspath(path)}: cannot write in {os.fspath(parent)!r}"
        raise err(msg)
    return p


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once at import (os.umask can only be read by setting it, which is not thread-safe):
# atomic writes give files the permissions a plain open() would.
_UMASK = _read_umask()


def write_text(what: str, path: str | Path, text: str, *, mode: int | None = None,
               err: type[Exception] = FileError) -> None:
    """Write ``text`` to ``path`` atomically (temporary file + rename)."""
    p = check_writable(what, path, err=err)
    parent = p.parent if str(p.parent) else Path(".")
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_UMASK)
        os.replace(tmp, p)
        tmp = None
    except OSError as exc:
        raise _fail(what, path, exc, err) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)



def make_dir(what: str, path: str | Path, *, err: type[Exception] = FileError) -> Path:
    """Create a folder (and its parents) for outputs; refuse a path that is a file."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        msg = f"{what}: {os.fspath(path)}: exists and is not a folder"
        raise err(msg)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(what, path, exc, err) from None
    return p

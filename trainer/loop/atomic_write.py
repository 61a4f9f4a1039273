"""Writing a file whole, and never through a link (docs/design.md §7, Report).

A report or plot is written into a directory a user owns, where `report.md` may be a symlink to
one of their own files: opening it for writing would overwrite that file. Instead the content
goes to a new file beside it (created with O_EXCL | O_NOFOLLOW: never an existing file, never a
link), which is renamed over the name when it is complete. A rename replaces a link itself, not
what it points to, and a reader never sees a half-written file. Here in `trainer/`, the lowest
layer that writes plots, so the trainer's plots and autok's reports share it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TRIES = 16  # a random name taken 16 times over is no accident: the error is raised


def _new_file_beside(path: Path) -> tuple[int, Path]:
    """A new, empty regular file in `path`'s directory (mode 0o666 less the umask, like
    `open`), named after it and hidden; (its descriptor, its path)."""
    for _ in range(_TRIES):
        # the name cut so the temporary one stays within a file name's 255 bytes
        tmp = path.with_name(f".{path.name[:200]}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, _FLAGS, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{path.parent}: no free temporary name for {path.name}")


@contextmanager
def replacing(path: Path, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """`open(path, mode, **kwargs)` for writing, except that the file object writes a new
    file that replaces `path` when the block ends (and is removed if the block raises)."""
    if "w" not in mode or "+" in mode:
        raise ValueError(f"replacing: mode {mode!r} is not a plain write")
    fd, tmp = _new_file_beside(Path(path))
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, encoding: str = "utf-8") -> None:
    """`Path.write_text`, through `replacing`."""
    with replacing(path, "w", encoding=encoding) as f:
        f.write(text)

"""Reading a notebook file for the commands that take one (``export``, ``execute``), and
checking where an executed one will be saved, before any work starts.

A file that is not JSON, JSON that is not a notebook (a list, a number) and a notebook nbformat
cannot read each become one :class:`NotebookFileError` naming the file, which the commands
print as one line, instead of a traceback from deep inside nbformat.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import nbformat

__all__ = ["NotebookFileError", "check_writable", "read_notebook"]


class NotebookFileError(ValueError):
    """The file is not a notebook, or the place to save one cannot be written."""


def read_notebook(path: str | os.PathLike[str]) -> nbformat.NotebookNode:
    """The notebook at ``path``, as nbformat version 4.

    Raises:
        FileNotFoundError: There is no such file.
        NotebookFileError: It is not a notebook.

    Example::

        read_notebook("notebooks/01_quickstart.ipynb").nbformat  # 4
    """
    source = Path(path)
    try:
        return nbformat.read(source, as_version=4)
    except (FileNotFoundError, IsADirectoryError):
        raise
    except nbformat.reader.NotJSONError as error:
        raise NotebookFileError(f"{source} is not a readable notebook: {error}") from error
    except (AttributeError, TypeError) as error:
        # nbformat reads any JSON value, then fails on what is not an object.
        raise NotebookFileError(
            f"{source} is not a readable notebook: it holds JSON, but not a notebook "
            "(an object with cells and nbformat)"
        ) from error
    except (ValueError, KeyError) as error:  # an object, but not one nbformat can read
        raise NotebookFileError(f"{source} is not a readable notebook: {error}") from error


def check_writable(output: str | os.PathLike[str]) -> None:
    """Make sure a file can be written at ``output`` (its folder created if missing),
    before running anything that would be lost if it could not.

    Raises:
        NotebookFileError: The folder cannot be made or written to, or ``output`` is a folder.

    Example:
        >>> check_writable("/tmp/run.ipynb")
    """
    target = Path(output)
    if target.is_dir():
        raise NotebookFileError(f"cannot save to {target}: it is a folder; name a file")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Writing a file says more than permission bits (root, read-only mounts).
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".nk-write-check-"):
            pass
        if target.exists() and not os.access(target, os.W_OK):
            raise PermissionError(f"{target} is read-only")
    except OSError as error:
        raise NotebookFileError(
            f"cannot save the executed notebook to {target}: {error}; pick another -o path"
        ) from error

"""What the zygote tests have a zygote's child run (imported in the child by name)."""

from __future__ import annotations

import os
import sys
import time


def report(argv: list[str]) -> int:
    """Write what the child sees to the pipe given, print a line, and exit with 3."""
    fd = int(argv[0])
    seen = f"{os.environ.get('ZYGOTE_TEST', '-')} {os.getppid()} {'torch' in sys.modules}"
    os.write(fd, seen.encode())
    os.close(fd)
    print("a line from the child", flush=True)
    return 3


def sleep(argv: list[str]) -> int:
    """Wait to be signalled or killed; tell the pipe given when sleeping."""
    if argv:
        os.write(int(argv[0]), b"sleeping")
    time.sleep(300)
    return 0

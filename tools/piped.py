"""The end of a tool whose stdout may be a pipe: `python3 tools/X.py | head` stops quietly,
with the status a shell gives a producer killed by SIGPIPE (141), as `cat` does."""

import os
import sys

READER_LEFT = 141


def exit_with(main):
    """sys.exit(main()), or 141 without a traceback when stdout's reader has left."""
    try:
        status = main()
        sys.stdout.flush()           # a pipe closed after the last write fails here
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = READER_LEFT
    sys.exit(status)

"""Command-line entry point: ``disaggsim <command> ...``.

Each command lives in its own module of this package and registers itself through ``add_parser``; this
module only dispatches and turns :class:`UserError` (and profile errors) into one line on
stderr with exit code 2, and a broken run invariant (:class:`InvariantError`) into
one line with exit code 3.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from types import FrameType
from typing import NoReturn

from disaggsim import __version__
from disaggsim.errors import (
    InvariantError,
    UserError,
    WorkersLost,
    kept_of,
    on_command_line,
    one_line,
)
from disaggsim.hardware.profile import ProfileError


class _Parser(argparse.ArgumentParser):
    """argparse with the project's bad-input rule: a flag argparse cannot parse (``--gpus
    1.5``, a missing value, an unknown flag) is one line naming it, exit code 2, instead
    of the usage block before the message. Subcommand parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.partition(" ")[2]
        where = f"{command}: " if command else ""
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:  # `--fabric nvlnk`: the choice meant, as a scenario's values say it
            from disaggsim.errors import closest_hint

            message += closest_hint(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        self.exit(2, f"disaggsim: error: {where}{one_line(message)} (see {self.prog} --help)\n")

    def _print_message(self, message: str, file=None) -> None:
        """``--help`` and ``--version`` text: a write the system refuses (``> /dev/full``, a
        full disk, a closed pipe) is raised, to be said in one line with exit 2 (or 141),
        where argparse drops it silently and exited 0. The error line on the standard error
        is written as :func:`_say` writes it: one the system refuses changes nothing."""
        if not message:
            return
        file = file if file is not None else sys.stderr
        if file is sys.stderr:
            _say(message.rstrip("\n"))
            return
        file.write(message)


def build_parser() -> argparse.ArgumentParser:
    from disaggsim.cli import bench, calibrate, compare, cost, plan, regress, run, sweep

    parser = _Parser(
        prog="disaggsim",
        description="Simulate disaggregated vs colocated LLM serving clusters.",
    )
    parser.add_argument("--version", action="version", version=f"disaggsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (run, cost, calibrate, bench, sweep, compare, regress, plan):
        command.add_parser(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The parser of the (sub)command ``args`` were parsed for: ``cost op gemm``'s, not the
    top-level one."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs and subs[0].dest else None
        if name is None or name not in subs[0].choices:
            return parser
        parser = subs[0].choices[name]


class _Terminated(BaseException):
    """SIGTERM or SIGHUP (``kill``, ``timeout``, a CI job cancelled, a terminal closed),
    raised where the command is, as Ctrl-C raises KeyboardInterrupt: the writers' cleanup
    runs (a result folder half-written into its temporary sibling is removed), where the
    signal's default action left the hidden ``.NAME.tmp-XXXXXXXX`` folder behind."""

    def __init__(self, signum: int) -> None:
        self.signum = signum


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise _Terminated(signum)


# the exit status a shell reports for a process SIGPIPE ended (128 + 13)
STDOUT_CLOSED = 141


def _stdout_closed() -> int:
    """Standard output was closed by its reader (``| head``): what the command prints
    after that is not wanted (run, sweep, compare and plan print once their files are in
    place). Exit
    quietly with the status of a process ended by SIGPIPE, as ``yes | head`` does (rich
    exited 1, the status of a regression that drifted; a plain print was a
    BrokenPipeError traceback). Standard output is pointed at /dev/null so the
    interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return STDOUT_CLOSED


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll reports an
    error on the writing end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def _kept(e: BaseException) -> str:
    """``; 7 of 20 runs finished and are kept in ...``: where a stopped command kept its
    finished work (:func:`disaggsim.errors.note_kept`), else nothing."""
    kept = kept_of(e)
    return f"; {one_line(kept)}" if kept else ""


# how an error names the standard output (a write to it carries no file name)
STDOUT_NAME = "standard output"


class _NamedStdout:
    """Standard output as the commands print to it: a write or flush the system refuses
    (``> /dev/full``, a full disk, a quota) raises the OSError with the file name
    :data:`STDOUT_NAME`, so its one line names where it could not write (it said only
    ``No space left on device``). Everything else is the stream's own."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            raise _named(e) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise _named(e) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _named(e: OSError) -> OSError:
    """``e`` naming the standard output (the same subclass: EPIPE stays BrokenPipeError)."""
    if e.errno is None:
        return e
    return OSError(e.errno, e.strerror, STDOUT_NAME)


def _say(line: str) -> None:
    """The command's error line on the standard error; one the system refuses (``2>
    /dev/full``) changes nothing else: the exit status still says what happened (it was
    an OSError traceback, exit 1, for bad input)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _printable_anywhere() -> None:
    """A character the terminal's encoding lacks (``×`` of "4 points × 1 seed" under
    ``PYTHONIOENCODING=ascii``) is printed as an escape: it was a UnicodeEncodeError
    traceback, exit 1, after the results were written."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            pass  # not a text stream that can be told (a test's capture, a closed one)


def main(argv: list[str] | None = None) -> int:
    _printable_anywhere()
    previous = {}
    if threading.current_thread() is threading.main_thread():  # signals: main thread only
        for sig in (signal.SIGTERM, signal.SIGHUP):
            # an ignored signal stays ignored: nohup's SIGHUP (closing the terminal stopped
            # a sweep started under nohup)
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, _raise_terminated)
    stdout = sys.stdout
    sys.stdout = _NamedStdout(stdout)
    try:
        with on_command_line():  # errors name the flags typed, not API arguments
            return _main(argv)
    except _Terminated as e:
        name = signal.Signals(e.signum).name
        _say(f"disaggsim: stopped by {name}; nothing half-written{_kept(e)}")
        return 128 + e.signum
    finally:
        sys.stdout = stdout
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        try:
            args, extra = parser.parse_known_args(argv)
            if extra:  # argparse names the top-level parser: name the command the flag missed
                _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
        except SystemExit as e:  # --help, --version, or a flag it cannot parse (one line, 2)
            sys.stdout.flush()  # the help text is out, or its error is said below
            return e.code if isinstance(e.code, int) else 2
        rc = args.func(args)
        sys.stdout.flush()  # what it printed is out, or its error is said here
    except SystemExit as e:
        # rich turns a closed pipe into SystemExit(1), the exit code of a regression that
        # drifted (`disaggsim regress | head -3` read as "drift")
        if isinstance(e.__context__, BrokenPipeError):
            return _stdout_closed()
        raise
    except (UserError, ProfileError) as e:
        _say(f"disaggsim: error: {one_line(str(e))}{_kept(e)}")
        return 2
    except OSError as e:
        if isinstance(e, BrokenPipeError) and _stdout_reader_gone():  # `| head`
            return _stdout_closed()  # (another pipe, a worker's or a socket's: below)
        # a path the system refuses (a name longer than the filesystem takes, a folder it
        # may not read, no space left): one line naming it, never a traceback. The checks
        # that know the flag or field name it themselves; this is the backstop.
        if e.filename == STDOUT_NAME:  # `> /dev/full`: what was written is said (_kept)
            _stdout_closed()  # the interpreter's final flush would fail again
            why = f"could not write what the command prints ({e.strerror})"
            _say(f"disaggsim: error: {STDOUT_NAME}: {why}{_kept(e)}")
            return 2
        where = f"{e.filename}: " if e.filename is not None else ""
        what = one_line(where + (e.strerror or str(e)))
        _say(f"disaggsim: error: {what}{_kept(e)}")
        return 2
    except InvariantError as e:
        kept = kept_of(e)
        done = f"; {kept}" if kept else "; nothing written"
        _say(f"disaggsim: internal error: {one_line(str(e))}{done} (please report)")
        return 3
    except WorkersLost as e:
        _say(f"disaggsim: error: {one_line(str(e))}{_kept(e)}")
        return 4
    except MemoryError as e:
        _say(f"disaggsim: error: out of memory{_kept(e)}")
        return 4
    except KeyboardInterrupt as e:
        _say(f"disaggsim: interrupted{_kept(e)}")
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())

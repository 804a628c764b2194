"""The operating environment a command meets, checked and made safe once, at its entry (``gptforge.cli.main``):

* the working directory: one that was removed under the shell is named in one line, before torch loads
  (torch's MKL otherwise dies with "Cannot load libtorch_cpu.so");
* the variables read as numbers (``NUMBER_VARIABLES``): a malformed one is named in one line; a malformed,
  non-positive or oversized ``OMP_NUM_THREADS`` (libgomp warns, or segfaults on 99999999) is replaced once, said
  once, before torch reads it; a umask that masks the owner's own permissions (0277, 0777) gives them back;
* the standard streams (:func:`standard_streams`): a closed fd 0/1/2 (``>&-``) is /dev/null, so no file the
  command opens takes its number; bytes stdin's encoding cannot decode are replaced (U+FFFD); text the stream's
  encoding cannot hold (``PYTHONIOENCODING=ascii``, a latin-1 locale, or an error handler Python does not know:
  ``ascii:bogus``) is replaced, not raised; a write that fails (a terminal that hung up: EIO; /dev/full:
  ENOSPC; a pipe with no reader: EPIPE) never kills a training run unsaved: the stream is pointed at /dev/null; a pipe
  whose reader left (``train | head``) stops the run as SIGTERM does (checkpoint, then exit 141), any other
  failure lets it run to its end, and the command ends with one line and a non-zero status; so does a command whose
  work is files (:func:`delivering`: an export, an ``eval --json``, a ``python -m`` tool's declared ``OUTPUTS``).
  Elsewhere stdout's failure still ends the command (a closed pipe: exit 141 quietly; anything else: one line,
  exit 2); stderr, diagnostics only, never ends it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from collections.abc import Callable, Iterator


class EnvError(ValueError):
    """A variable of the environment (or the working directory) that the command cannot run with."""


# integer variables torchrun and torchelastic set, and gptforge's own number variables: (kind, least value)
NUMBER_VARIABLES: dict[str, tuple[type, float]] = {
    "WORLD_SIZE": (int, 1), "RANK": (int, 0), "LOCAL_RANK": (int, 0), "LOCAL_WORLD_SIZE": (int, 1),
    "TORCHELASTIC_RESTART_COUNT": (int, 0), "GPTFORGE_ANNOUNCE_AFTER": (float, 0),
}


def number(name: str, default: float) -> float:
    """``name``'s value as NUMBER_VARIABLES says, ``default`` when unset or empty; EnvError naming it when
    malformed (a traceback from int() deep inside a run before)."""
    raw = os.environ.get(name, "").strip(" \t\n\r\f\v")  # ASCII white space: C skips no other
    if not raw:
        return default
    kind, least = NUMBER_VARIABLES[name]
    try:
        v = kind(_c_number(raw))
    except ValueError:
        v = None
    if v is None or not (least <= v < float("inf")):
        what = "a whole number" if kind is int else "a number"
        raise EnvError(f"environment variable {name}={raw!r}: expected {what} >= {least:g}; unset it or fix it")
    return v


def check_cwd() -> None:
    try:
        os.getcwd()
    except FileNotFoundError:
        raise EnvError("the current directory no longer exists (it was removed while the shell stood in it): cd "
                       "to a folder that exists and run the command again") from None


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


THREADS_PER_CPU_MAX = 64


def _c_number(raw: str) -> str:
    """``raw`` if it is a number as C's strtol reads it (torchrun, libgomp), ASCII with no '_'; else ValueError.
    Python's int() also reads '４' (full-width), '٤' (Arabic-Indic) and '1_0' (as 10), which no C reader of the
    same variable takes: gptforge and the library would read one variable two ways."""
    if not raw.isascii() or "_" in raw:
        raise ValueError(raw)
    return raw


def omp_levels(raw: str) -> list[int] | None:
    """OMP_NUM_THREADS as libgomp reads it: a positive whole number per nesting level, comma-separated
    ("4", " +4 ", "4,1": 4 threads, 1 in each nested region); None when it is not that."""
    try:
        levels = [int(_c_number(part.strip(" \t\n\r\f\v"))) for part in raw.split(",")]
    except ValueError:
        return None
    return levels if all(n >= 1 for n in levels) else None


def omp_threads() -> int | None:
    """The thread count OMP_NUM_THREADS gives the outer level (what torch's intra-op pool gets), or None when unset
    or not a value libgomp takes. The one parse: :func:`fix_thread_count` and ``runtime.auto_threads``."""
    levels = omp_levels(os.environ.get("OMP_NUM_THREADS", ""))
    return levels[0] if levels else None


def fix_thread_count(say: Callable[[str], None]) -> None:
    """OMP_NUM_THREADS, before torch's OpenMP reads it: a value libgomp does not take (:func:`omp_levels`) is
    dropped (the thread count is then gptforge's own, --train.threads), an outer level past THREADS_PER_CPU_MAX a
    usable CPU is capped at the CPUs (libgomp segfaults on 99999999; a deliberate oversubscription, 2-4 threads a
    core as docs/benchmarks.md measures, is left alone). Said once: the variable is rewritten, so a re-executed
    command (tcmalloc) or a worker sees the fixed value."""
    raw = os.environ.get("OMP_NUM_THREADS")
    if raw is None:
        return
    levels = omp_levels(raw)
    cpus = usable_cpus()
    if levels is None:
        del os.environ["OMP_NUM_THREADS"]
        say(f"gptforge: OMP_NUM_THREADS={raw!r} is not a positive whole number (or a comma list of them, one a "
            f"nesting level); ignoring it (unset it, or set 1..{cpus})")
    elif levels[0] > THREADS_PER_CPU_MAX * cpus:
        os.environ["OMP_NUM_THREADS"] = ",".join(map(str, [cpus, *levels[1:]]))
        say(f"gptforge: OMP_NUM_THREADS={raw} is far more than the {cpus} CPUs this process may use; using {cpus}")


def fix_umask(say: Callable[[str], None]) -> None:
    """A umask that takes the owner's own permissions away (0277, 0777) makes every folder and file the command
    creates one it cannot write into or read back (its run folder's lock, then its checkpoints: "permission
    denied" on a path the user did give right). The owner's bits are given back for this command, the group's and
    others' left as masked (the privacy the umask asked for), said once (a re-executed command inherits it)."""
    old = os.umask(0)
    new = old & ~0o700
    os.umask(new)
    if new != old:
        say(f"gptforge: umask {old:04o} would leave this command unable to read back or write into what it creates; "
            f"using {new:04o} (others' permissions still masked)")


def check_environment(say: Callable[[str], None]) -> None:
    """Everything above, in order: the working directory, the number variables, the thread count, the umask."""
    check_cwd()
    for name in NUMBER_VARIABLES:
        number(name, 0)
    fix_thread_count(say)
    fix_umask(say)


# --- the standard streams ---------------------------------------------------------------------------

_runs = 0  # training runs in progress in this process (gptforge.run.signals.StopFlag): stdout never stops them
_stoppers: list[Callable[[str], None]] = []  # each run's polite stop (StopFlag.request_stop), newest last
_hung_up = False  # SIGHUP came: whatever the streams say from here on has nobody to read it


def run_started(stop: Callable[[str], None] | None = None) -> None:
    """A training run begins; ``stop(reason)`` asks it to checkpoint and end at its next step boundary."""
    global _runs
    _runs += 1
    if stop is not None:
        _stoppers.append(stop)
        out = sys.stdout
        if isinstance(out, GuardedStream) and out.strict and out.reader_gone:  # it left before the run began (a
            stop("stdout's reader left (a closed pipe)")  # resume's notice, under delivering): stopped as it would be


@contextlib.contextmanager
def delivering(files: bool) -> Iterator[None]:
    """A command whose work is files (``export``, ``eval --json``, ``tokenizer train``, ``prepare``): a stdout that
    fails (``| head -1``, ``| true``) is pointed at /dev/null and the command goes on to write them, then ends 141
    (a closed pipe) or says it in one line, as a run does (without a stop: it has no step boundary to stop at).
    Before, the first print after the reader left ended it, its outputs unwritten. ``files`` False: stdout is all
    the command delivers, so a reader that left ends it at once."""
    if not files:
        yield
        return
    run_started()
    try:
        yield
    finally:
        run_ended()


def run_ended(stop: Callable[[str], None] | None = None) -> None:
    global _runs
    _runs = max(0, _runs - 1)
    if stop is not None and stop in _stoppers:
        _stoppers.remove(stop)


def note_hangup() -> None:
    global _hung_up
    _hung_up = True


def hung_up() -> bool:
    return _hung_up


def pipe_reader_gone(stream) -> bool:
    """Whether ``stream`` is a pipe whose reader has gone (poll says POLLERR/POLLHUP on its write end): only then
    is a BrokenPipeError the reader's doing; one from a socket or a worker's pipe is a real error."""
    import select

    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):  # something without a file descriptor
        return False
    if not hasattr(select, "poll"):  # Windows: no poll; stdout's own flush is the one that failed there
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _to_devnull(stream) -> None:
    """Point the stream's file descriptor at /dev/null: what is still buffered, and Python's flush at exit,
    then have somewhere to go."""
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return
    try:
        nul = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(nul, fd)
    except OSError:
        pass
    finally:
        os.close(nul)


class GuardedStream:
    """A text stream whose encoding errors are replaced and whose write failures follow the module docstring."""

    def __init__(self, inner, name: str, strict: bool) -> None:
        self.inner, self.name, self.strict = inner, name, strict
        self.failed: OSError | None = None
        self.reader_gone = False

    def write(self, s: str) -> int:
        if self.failed is not None:
            return len(s)
        try:
            try:
                return self.inner.write(s)
            except (UnicodeEncodeError, LookupError):  # LookupError: PYTHONIOENCODING=ascii:NAME names no handler
                enc = getattr(self.inner, "encoding", None) or "ascii"
                self.inner.write(s.encode(enc, "replace").decode(enc))
                return len(s)
        except OSError as e:
            self._fail(e)
            return len(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.failed is not None:
            return
        try:
            self.inner.flush()
        except OSError as e:
            self._fail(e)

    def _fail(self, e: OSError) -> None:
        # stdout outside a run: the command's output failed, so the command does (a closed pipe's reader left:
        # gptforge.cli ends it quietly, 141); after a hangup (the terminal gone: EIO) nobody is there to be told
        self.failed = e
        self.reader_gone = e.errno == errno.EPIPE and pipe_reader_gone(self.inner)  # (before /dev/null replaces it)
        fatal = self.strict and not _runs and not _hung_up
        if self.strict and self.reader_gone and _runs and _stoppers:
            # `gptforge train | head`: the reader has what it wanted. The run stops as on SIGTERM (its checkpoint
            # first, then exit 141), not at once unsaved, and not on for hours printing to nobody
            _stoppers[-1]("stdout's reader left (a closed pipe)")
        if not (fatal and e.errno == errno.EPIPE):  # (a closed pipe is recognised by gptforge.cli, then silenced)
            _to_devnull(self.inner)  # what is still buffered, and the flush at exit, go nowhere, not fail again
        if fatal:
            e.gptforge_stream = self.name
            raise e

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _open_closed_fds() -> None:
    """A closed fd 0, 1 or 2 (``>&-``) becomes /dev/null, so that no file opened later takes its number (a
    checkpoint written through fd 1 by the next print)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                nul = os.open(os.devnull, os.O_RDWR)
            except OSError:
                return
            if nul != fd:
                os.dup2(nul, fd)
                os.close(nul)


class Streams:
    """What :func:`standard_streams` yields: the guarded stdout and stderr, and the command's outcome."""

    def __init__(self, out: GuardedStream, err: GuardedStream) -> None:
        self.out, self.err = out, err

    def outcome(self, command: str, code: int, closed_code: int) -> int:
        """The exit status once the command returned ``code``: a stdout that failed during a run is said in one
        line (on stderr, if that still takes it) and makes a successful command's status non-zero."""
        e = self.out.failed
        if e is None or _hung_up:
            return code
        if self.out.reader_gone:  # `gptforge train | head`: the reader's choice, said as a shell says it (a run it
            if os.environ.get("TORCHELASTIC_RUN_ID"):  # stopped saved first and returned 130), except to torchrun:
                return code  # a non-zero worker is a failure it reports, or restarts (run/faults.py's exit_status)
            return closed_code if code in (0, 130) else code
        self.err.write(f"{command}: error: stdout stopped taking output ({e.strerror or e}); what it printed "
                       "after that was lost, though the command ran to its end and its files are complete\n")
        self.err.flush()
        return code or 2


@contextlib.contextmanager
def standard_streams() -> Iterator[Streams]:
    """Guard sys.stdout and sys.stderr for one command; the streams in place before are back afterwards."""
    _open_closed_fds()
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is None:  # closed at the interpreter's start (now /dev/null, above)
            setattr(sys, name, os.fdopen(fd, mode, closefd=False, encoding="utf-8", errors="replace"))
    stdin, stdin_errors = sys.stdin, getattr(sys.stdin, "errors", None)
    if stdin_errors is not None and stdin_errors != "replace" and hasattr(stdin, "reconfigure"):
        try:  # bytes the encoding cannot decode (latin-1 typed into a UTF-8 `chat`): U+FFFD, not a traceback
            stdin.reconfigure(errors="replace")
        except (ValueError, OSError, io.UnsupportedOperation):
            stdin_errors = None
    else:
        stdin_errors = None
    before = sys.stdout, sys.stderr
    out = before[0] if isinstance(before[0], GuardedStream) else GuardedStream(before[0], "stdout", strict=True)
    err = before[1] if isinstance(before[1], GuardedStream) else GuardedStream(before[1], "stderr", strict=False)
    sys.stdout, sys.stderr = out, err
    try:
        yield Streams(out, err)
    finally:
        if stdin_errors is not None:
            with contextlib.suppress(ValueError, OSError, io.UnsupportedOperation):
                stdin.reconfigure(errors=stdin_errors)
        if (sys.stdout, sys.stderr) == (out, err) and out is not before[0]:  # the outermost command's: undone
            sys.stdout, sys.stderr = before
            global _hung_up
            _hung_up = False  # (an in-process caller's next command meets its own terminal)


EXIT_BAD_INPUT = 2
EXIT_STDOUT_CLOSED = 141  # what a shell reports for a writer its reader left (128 + SIGPIPE), as `yes | head` gives


def guarded(name: str, body: Callable[[], int | None]) -> int:
    """The one entry of every command (gptforge.cli.main) and ``python -m gptforge...`` tool (:func:`tool`): the
    environment checked, the streams guarded, then ``body()``; its exit status. ``name`` begins its lines.

    A reader that stops early (`gptforge train --help-config | head`) ends it quietly, exit 141, instead of a
    BrokenPipeError traceback: stdout is flushed here so the closed pipe is met inside this guard, not at
    interpreter exit ("Exception ignored ... BrokenPipeError"), and then pointed at /dev/null so the exit's own
    flush has nowhere to fail."""
    try:
        with standard_streams() as streams:
            try:
                check_environment(lambda msg: print(msg, file=sys.stderr, flush=True))
            except EnvError as e:
                print(f"{name}: error: {e}", file=sys.stderr)
                return EXIT_BAD_INPUT
            try:
                try:
                    code = body() or 0
                except SystemExit as done:  # --help and argparse's refusals exit from inside the parser
                    sys.stdout.flush()
                    if streams.out.failed is None:
                        raise
                    # argparse swallows a failed write of its help (`--help > /dev/full`): said here instead
                    return streams.outcome(name, done.code if isinstance(done.code, int) else 1, EXIT_STDOUT_CLOSED)
                sys.stdout.flush()
            except OSError as e:
                stream = getattr(e, "gptforge_stream", None)
                if stream is None or isinstance(e, BrokenPipeError):  # a closed pipe's reader: 141, below
                    raise
                print(f"{name}: error: cannot write to {stream}: {e.strerror or e} (point it at a file, a pipe or a "
                      "terminal that takes output)", file=sys.stderr)
                return EXIT_BAD_INPUT
            return streams.outcome(name, code, EXIT_STDOUT_CLOSED)
    except BrokenPipeError:
        if not pipe_reader_gone(sys.stdout):  # a worker's pipe, a socket: a real error
            raise
        _to_devnull(sys.stdout)
        return EXIT_STDOUT_CLOSED


def tool_writes_files(main: Callable[[], int | None], argv: list[str]) -> bool:
    """Whether this invocation of a ``python -m gptforge...`` tool has files for its work, from the ``OUTPUTS`` its
    module declares (as gptforge.cli.outputs declares the commands'): a tuple of the words that mean so when given,
    an output flag (``"--json"``, also as ``--json=F`` or an abbreviation argparse takes) or a subcommand whose
    argument is its output (llmc's ``"shard"``); ``""``: always (an output with a default place)."""
    outputs = getattr(sys.modules.get(getattr(main, "__module__", ""), None), "OUTPUTS", ())
    if "" in outputs:
        return True
    words = argv[:argv.index("--")] if "--" in argv else argv
    for word in words:
        head = word.split("=", 1)[0]
        if head in outputs or (head.startswith("--") and len(head) > 3
                               and any(flag.startswith(head) for flag in outputs if flag.startswith("--"))):
            return True
    return False


def tool(main: Callable[[], int | None], name: str) -> int:
    """``if __name__ == "__main__": raise SystemExit(environment.tool(main, "python -m gptforge.bench.x"))``: the
    tool's ``main()`` under :func:`guarded`, and under :func:`delivering` when its module's ``OUTPUTS`` says this
    invocation writes files (:func:`tool_writes_files`), so a closed stdout (``... --json r.json | true``) does
    not cost them, as it does not cost a command's."""
    files = tool_writes_files(main, sys.argv[1:])

    def body() -> int | None:
        with delivering(files):
            return main()

    return guarded(name, body)

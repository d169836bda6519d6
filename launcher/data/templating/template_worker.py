"""`data prepare` renders every conversation's chat template in one child process, under a budget
the parent enforces from outside.

The guard inside the template sandbox (``templating.template_sandbox``) stops the templates it
can see going over their budget, with the template line. What it cannot see (one C-level
operation on a huge value, a filter looping in Python over a huge string) is caught here: the
child runs with an address-space limit (RLIMIT_AS: ``DataLimits.render_memory_bytes`` beyond what
it holds when it starts, so an allocation past it is a MemoryError, reported), and the parent
kills it when a conversation's reply is ``WATCHDOG_GRACE_S`` later than the template's time
budget. Either way `data prepare` exits 2 naming the conversation (FILE:LINE), the template, and
the budget; the child dies with the parent (PR_SET_PDEATHSIG, ``launcher.orphans``).

One child renders all records, streamed: the parent keeps up to ``IN_FLIGHT`` conversations sent
ahead (a thread writes them; the main thread reads replies and tokenizes), so rendering and
tokenizing overlap. Frames are JSON lines both ways (nothing is unpickled):

    parent -> child   {"source", "special_tokens", "origin", "specials", "record_bytes",
                       "seconds", "memory_bytes"}, then one list of messages a line
    child -> parent   {"ready": true} (or {"error"}), then {"text", "spans"} or
                      {"error", "kind"} a line

Run as ``python -m launcher.data.templating.template_worker PARENT_PID``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from launcher.data.limits import DataLimits
from launcher.errors import UserError
from launcher.excerpt import message as quoted

IN_FLIGHT = 64  # conversations sent ahead of the one being read back
BATCH = 16  # conversations handed to the writer thread at once
STARTUP_S = 120.0  # the child's interpreter start and jinja2 import, on a loaded machine
WATCHDOG_GRACE_S = 5.0  # past the template's own time budget, before the child is killed
_CHUNK = 1 << 20


class TemplateWorker:
    """The child process and the two pipes to it; use as a context manager."""

    def __init__(self, template: Any, specials: Sequence[str], limits: DataLimits):
        self.origin = template.origin
        self.limits = limits
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        package_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "launcher.data.templating.template_worker", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            start_new_session=True,  # ^C reaches the parent, which stops the child
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._out = self._proc.stdout.fileno()
        self._buffer = bytearray()
        self._pos = 0
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._outbox: list[bytes] = []
        self._writer = threading.Thread(target=self._feed, name="template-feed", daemon=True)
        self._writer.start()
        self._send(
            {
                "source": template.source,
                "special_tokens": template.special_tokens,
                "origin": template.origin,
                "specials": list(specials),
                "record_bytes": limits.record_bytes,
                "seconds": limits.template_seconds,
                "memory_bytes": limits.render_memory_bytes,
            }
        )
        self._flush()
        ready = self._reply(time.monotonic() + STARTUP_S, "while it started")
        if "error" in ready:
            self.close()
            raise UserError(str(ready["error"]))

    # --- the parent's side ---------------------------------------------------------------------
    def render_all(
        self, conversations: Iterable[Any]
    ) -> Iterator[tuple[Any, str, list[tuple[int, int, int]]]]:
        """(conversation, text, spans) of each conversation, in order. A conversation the
        template refuses, or one that runs over a budget, is a UserError naming it (an error
        reading a later record waits until every conversation before it is answered)."""
        pending: collections.deque[tuple[Any, float]] = collections.deque()
        answered = time.monotonic()
        records = iter(conversations)
        while True:
            try:
                conversation = next(records)
            except StopIteration:
                break
            except UserError:
                while pending:
                    yield self._answer(*pending.popleft(), answered)
                    answered = time.monotonic()
                raise
            self._send([dict(m) for m in conversation.messages])
            if len(self._outbox) >= BATCH:
                self._flush()
            pending.append((conversation, time.monotonic()))
            if len(pending) >= IN_FLIGHT:  # read back a batch: the writer hands over batches
                for _ in range(BATCH):
                    yield self._answer(*pending.popleft(), answered)
                    answered = time.monotonic()
        while pending:
            yield self._answer(*pending.popleft(), answered)
            answered = time.monotonic()

    def _answer(
        self, conversation: Any, sent: float, answered: float
    ) -> tuple[Any, str, list[tuple[int, int, int]]]:
        # The child starts a conversation once it has answered the one before and has it.
        self._flush()
        deadline = max(sent, answered) + self.limits.template_seconds + WATCHDOG_GRACE_S
        where = conversation.where
        reply = self._reply(deadline, f"while rendering {where}")
        if "error" in reply:  # kind: None (refused or failed), "time", "size" or "memory"
            said, kind = str(reply["error"]), reply.get("kind")
            raise refusal(where, self.origin, said, kind, self.limits)
        spans = [(int(k), int(a), int(b)) for k, a, b in reply["spans"]]
        return conversation, str(reply["text"]), spans

    def _send(self, document: Any) -> None:
        try:
            frame = json.dumps(document, ensure_ascii=False).encode("utf-8") + b"\n"
        except UnicodeEncodeError:
            raise UserError("a record holds a lone surrogate (U+D800-U+DFFF)") from None
        self._outbox.append(frame)

    def _flush(self) -> None:
        """The frames not yet handed over, to the writer thread in one piece."""
        if self._outbox:
            self._queue.put(b"".join(self._outbox))
            self._outbox.clear()

    def _feed(self) -> None:
        """The writer thread: frames to the child's stdin until None (or the child is gone)."""
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            for frame in iter(self._queue.get, None):
                stdin.write(frame)
                stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return
        finally:
            with contextlib.suppress(BrokenPipeError, OSError):
                stdin.close()

    def _reply(self, deadline: float, when: str) -> dict[str, Any]:
        """The next reply line; the child killed and a UserError past `deadline`, or when it
        ends."""
        while True:
            end = self._buffer.find(b"\n", self._pos)
            if end >= 0:
                line = self._buffer[self._pos : end]
                self._pos = end + 1
                if self._pos > _CHUNK:
                    del self._buffer[: self._pos]
                    self._pos = 0
                document: dict[str, Any] = json.loads(line)
                return document
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                raise UserError(self._overran(when))
            readable, _, _ = select.select([self._out], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(self._out, _CHUNK)
            if not chunk:
                raise UserError(self._ended(when))
            self._buffer += chunk

    def _overran(self, when: str) -> str:
        where = when.removeprefix("while rendering ")
        if where == when:
            return f"the chat template renderer did not start within {STARTUP_S:g} s"
        return str(refusal(where, self.origin, "", "time", self.limits, killed=True))

    def _ended(self, when: str) -> str:
        code = self._proc.wait()
        how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 4000))
        tail = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        said = f"; it said: {quoted(tail[-1])}" if tail else ""
        memory = f"{self.limits.render_memory_bytes / 2**30:.1f} GiB"
        return (
            f"the chat template renderer ended ({how}) {when}{said}; out of memory (its budget "
            f"is {memory}, {self.limits.raise_hint()}) or killed from outside"
        )

    def _kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def close(self) -> None:
        self._queue.put(None)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill()
        self._writer.join(timeout=10)
        assert self._proc.stdout is not None
        self._proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> TemplateWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._kill()
        self.close()


def refusal(
    where: str,
    origin: str,
    said: str,
    kind: str | None,
    limits: DataLimits,
    killed: bool = False,
) -> UserError:
    """The one wording of a conversation the template refused (`kind` None) or stopped on."""
    head = f"{where}: the chat template ({origin})"
    if kind is None:
        return UserError(f"{head} refuses this conversation: {said}")
    if killed:
        return UserError(
            f"{head} stopped: rendering this conversation took longer than "
            f"{limits.template_seconds:g} s (real templates take milliseconds); the renderer "
            "was stopped"
        )
    if kind == "memory":
        memory = f"{limits.render_memory_bytes / 2**30:.1f} GiB"
        return UserError(
            f"{head} {said}: rendering this conversation needed more than the renderer's "
            f"{memory} (64 x the record budget, at least 2 GiB: {limits.raise_hint()})"
        )
    return UserError(f"{head} {said}")


# --- the child's side ----------------------------------------------------------------------------
def _limit_memory(extra: int) -> None:
    """RLIMIT_AS: what this process maps now, plus `extra` bytes (Linux; elsewhere nothing)."""
    try:
        import resource

        with open("/proc/self/statm", "rb") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + extra
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _write(document: dict[str, Any]) -> None:
    """One answer, sent at once: the parent times each conversation by its answer."""
    sys.stdout.buffer.write(json.dumps(document, ensure_ascii=False).encode("utf-8") + b"\n")
    sys.stdout.buffer.flush()


def _serve() -> None:
    from launcher.data.templating.chat_template import (
        ChatTemplate,
        TemplateBudgetExceeded,
        TemplateRenderError,
    )

    config = json.loads(sys.stdin.buffer.readline())
    limits = DataLimits(int(config["record_bytes"]), float(config["seconds"]))
    template = ChatTemplate(config["source"], dict(config["special_tokens"]), config["origin"])
    specials = tuple(config["specials"])
    try:
        template.check()
    except UserError as exc:
        _write({"error": str(exc)})
        return
    _limit_memory(int(config["memory_bytes"]))
    _write({"ready": True})
    for line in sys.stdin.buffer:
        try:
            messages = json.loads(line)
            text, spans = template.conversation(messages, specials, limits)
            _write({"text": text, "spans": spans})
        except TemplateBudgetExceeded as exc:
            _write({"error": str(exc), "kind": exc.kind})
        except TemplateRenderError as exc:
            _write({"error": str(exc), "kind": None})
        except MemoryError:
            _write({"error": "stopped: it ran out of memory", "kind": "memory"})


def main(argv: list[str]) -> None:
    from launcher.orphans import die_with_parent

    die_with_parent(int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve()


if __name__ == "__main__":
    main(sys.argv)

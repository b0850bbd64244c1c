"""One child process as the router sees it: its output, its exit, and how to end it.

Its log lines pass through to the router's stderr as the child wrote them; anything else it
prints (a traceback, a crash message) becomes a router log line; a short tail is kept for
error messages. Exit is an asyncio future set the instant the process ends (a waiter thread
blocks in `wait()`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Sequence

from protocol.log_format import parse_line

logger = logging.getLogger(__name__)
# a child's own log lines, formatted and written to its file by the child: the router's
# logging sends them to stderr as they are (router.log_files.configure_router_logging)
output_logger = logging.getLogger(f"{__name__}.output")

LOG_TAIL_LINES = 50
_LEVELS = {name: getattr(logging, name) for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}


def line_level(line: str) -> int:
    """The level a child logged `line` at (text or JSON), so the router's --log-level filters
    them like its own lines. Output that is not a log line (a traceback, a crash message)
    counts as a warning: it is never routine."""
    head = parse_line(line)
    return _LEVELS.get(head.level, logging.WARNING) if head is not None else logging.WARNING


def describe_exit(returncode: int) -> str:
    """`exit code 1` / `killed by signal SIGKILL`, for messages a person reads."""
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class ChildProcess:
    """A spawned child whose stdout+stderr are forwarded, line by line: its log lines as
    they are (it wrote them to its own file too), other output as router log lines, which
    land in router.log, so a crash is on record even when the child could not log it.

    Must be created on the event loop that awaits `exited`. The child gets its own
    session, so a Ctrl-C in the terminal reaches only the router, which then shuts
    children down in order instead of having them die mid-request.
    """

    def __init__(self, argv: Sequence[str], label: str, env: dict[str, str] | None = None) -> None:
        self.label = label
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = loop.create_future()
        self.process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
        self.pid = self.process.pid
        self._reader = threading.Thread(target=self._forward_output, name=f"{label}-output", daemon=True)
        self._reader.start()
        threading.Thread(target=self._wait_exit, args=(loop,), name=f"{label}-exit", daemon=True).start()

    def _forward_output(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for raw in self.process.stdout:
                line = raw.decode(errors="replace").rstrip()
                if line:
                    self.tail.append(line)
                    head = parse_line(line)
                    if head is not None:
                        output_logger.log(_LEVELS.get(head.level, logging.WARNING), "%s", line)
                    else:  # line_level's warning, but with the label: the line does not say who
                        logger.warning("%s| %s", self.label, line)

    def _wait_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        returncode = self.process.wait()
        try:
            loop.call_soon_threadsafe(self._set_exited, returncode)
        except RuntimeError:  # the loop is already closed: nobody is waiting any more
            pass

    def _set_exited(self, returncode: int) -> None:
        if not self.exited.done():
            self.exited.set_result(returncode)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def live_pid(self) -> int | None:
        """Its pid while it runs; None once it has exited (a pid may be reused after)."""
        return self.pid if self.alive() else None

    async def output_tail(self, num_lines: int = 20, wait_s: float = 1.0) -> str:
        """The last lines it printed; waits briefly for output still in the pipe."""
        await asyncio.to_thread(self._reader.join, wait_s)
        return "\n".join(list(self.tail)[-num_lines:])

    def kill(self) -> None:
        if self.alive():
            self.process.kill()

    async def stop(self, kill_after_s: float) -> int:
        """SIGTERM, wait up to `kill_after_s`, then SIGKILL; returns the exit status."""
        if self.alive():
            self.process.terminate()
            try:
                return await asyncio.wait_for(asyncio.shield(self.exited), kill_after_s)
            except TimeoutError:
                logger.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it",
                               self.label, self.pid, kill_after_s)
                self.process.kill()
        return await self.exited

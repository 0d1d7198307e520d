"""Run `graphopt` commands fast, each in its own process, with a time limit.

`python -m graphopt` costs a second or more of start-up (imports, the pattern
library); a corpus of dozens of cases, or dozens of runs to kill, would spend most of
its time there. `WarmCli` starts one server process that runs graphopt once (the
warm-up: every lazy import done, the built-in patterns parsed) and then forks one
child per command. A child runs the same `graphopt.cli.main` a user's `graphopt`
runs, in its own process: its exit status, stdout and stderr are its own, a crash
or a signal shows as a negative status, and a child that hangs is killed at its
time limit. The server reaps a child only when asked (`kill`/`wait`), so a pid it
reports is never reused while the caller may still signal it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WarmCli", "Finished", "REPO"]

REPO = Path(__file__).resolve().parents[2]

# Requests on stdin, one per line; answers on stdout, one line each.
#   run {"args": [...], "cwd": ..., "stdout": path, "stderr": path}  -> the child's pid
#   kill / wait                                                      -> its exit status and peak RSS (KiB)
_SERVER = r"""
import json, os, signal, sys
from graphopt.cli import main

def run(args):
    try:
        main(args)
    except SystemExit as exit:
        return exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    return 0

warm_up = json.loads(sys.argv[1])
if warm_up:
    with open(os.devnull, "w") as sink:
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1), os.dup2(sink.fileno(), 2)
        code = run(warm_up)
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
    if code != 0:
        print(f"warm-up failed with exit {code}", flush=True)
        sys.exit(1)
rss_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))
print("ready", rss_kib, flush=True)
child = None
for line in sys.stdin:
    request, _, payload = line.strip().partition(" ")
    if request == "run":
        job = json.loads(payload)
        child = os.fork()
        if child == 0:
            os.chdir(job["cwd"])
            for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
            os._exit(run(job["args"]))
        print(child, flush=True)
    elif request in ("kill", "wait"):
        if request == "kill":
            os.kill(child, signal.SIGKILL)  # not reaped yet: still our child, a zombie at worst
        _, status, usage = os.wait4(child, 0)
        child = None
        print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, flush=True)
"""


@dataclass(frozen=True)
class Finished:
    returncode: int  #: negative: killed by that signal (-9 also when it ran past its time limit)
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    #: The child's peak resident memory. It starts as the warm server's (the pages it
    #: shares after the fork count too), so compare it with `WarmCli.baseline_rss_bytes`.
    max_rss_bytes: int


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("FORCE_COLOR", None)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    env.pop("GRAPHOPT_FAST_IO", None)
    return env


def _running(pid: int) -> bool:
    """Alive and not a zombie (ended, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class WarmCli:
    """One warm graphopt server; `start`/`kill`/`wait` or `run` one command at a time."""

    def __init__(self, warm_up: list[str] | None = None) -> None:
        self._server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, json.dumps(warm_up or [])],
            cwd=REPO,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._scratch = Path(tempfile.mkdtemp(prefix="graphopt-warmcli-"))
        self.pid: int | None = None
        self.last_max_rss_bytes = 0
        answer = self._answer()
        if not answer.startswith("ready"):
            self.close()
            raise RuntimeError(f"graphopt server did not start: {answer or 'it exited'}")
        #: The server's resident memory when ready: where every child's peak starts.
        self.baseline_rss_bytes = int(answer.split()[1]) * 1024

    def _answer(self) -> str:
        assert self._server.stdout is not None
        return self._server.stdout.readline().strip()

    def _ask(self, request: str) -> str:
        assert self._server.stdin is not None
        self._server.stdin.write(request + "\n")
        self._server.stdin.flush()
        return self._answer()

    def start(self, args: list[str | os.PathLike[str]], cwd: Path | None = None) -> int:
        """Start `graphopt ARGS` in a child; returns its pid."""
        assert self.pid is None, "one command at a time"
        job = {"args": [str(a) for a in args], "cwd": str(cwd or REPO), "stdout": str(self._scratch / "out"), "stderr": str(self._scratch / "err")}
        self.pid = int(self._ask("run " + json.dumps(job)))
        return self.pid

    def running(self) -> bool:
        return self.pid is not None and _running(self.pid)

    def kill(self) -> int:
        """SIGKILL the child (if it still runs); its exit status."""
        return self._reap("kill")

    def wait(self) -> int:
        return self._reap("wait")

    def _reap(self, request: str) -> int:
        self.pid = None
        status, max_rss_kib = self._ask(request).split()
        self.last_max_rss_bytes = int(max_rss_kib) * 1024
        return int(status)

    def output(self) -> tuple[str, str]:
        read = lambda name: (self._scratch / name).read_text(errors="replace")  # noqa: E731
        return read("out"), read("err")

    def run(self, args: list[str | os.PathLike[str]], cwd: Path | None = None, timeout: float = 30) -> Finished:
        """Run `graphopt ARGS` to the end, or kill it at `timeout` seconds."""
        started = time.monotonic()
        self.start(args, cwd)
        while self.running() and time.monotonic() - started < timeout:
            time.sleep(0.002)
        timed_out = self.running()
        status = self.kill() if timed_out else self.wait()
        stdout, stderr = self.output()
        return Finished(status, stdout, stderr, timed_out, time.monotonic() - started, self.last_max_rss_bytes)

    def close(self) -> None:
        if self._server.stdin is not None:
            self._server.stdin.close()
        try:
            self._server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()
        for name in ("out", "err"):
            (self._scratch / name).unlink(missing_ok=True)
        self._scratch.rmdir()

    def __enter__(self) -> WarmCli:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""A person's session at a real terminal (tmux): the everyday verbs against a real daemon.

The test types into a tmux pane what an operator would type, on the process runtime with the
stand-in vLLM and a recorded host, and reads the screen back: `up` of a two-member swap group
(one member rests asleep) returns, `status` is a table, `logs -f` in a second window follows a
restart (daemon lines and the new server's), `logs --previous` shows the server before the restart,
a second terminal without the first one's exports is told that the config file does not exist
(and works once it repeats them), a config typo is refused by `dankserve reload` while `status`
keeps working and names the refusal, and the fixed file is accepted.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.daemon import free_port, process_deployment, write_config, write_host
from tests.harness.wait import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (scripts/apt-packages.txt)"),
]

BIN = Path(sys.executable).parent
WIDTH, HEIGHT = 120, 50


@dataclass
class Terminal:
    """One tmux server on a private socket; windows by name; commands typed with a marker after each."""

    socket: Path
    session: str
    count: int = 0

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout

    def screen(self, window: str = "main") -> str:
        """Everything the window has shown, history included, wrapped lines joined."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", f"{self.session}:{window}")

    def keys(self, text: str, window: str = "main", enter: bool = True) -> None:
        self.tmux("send-keys", "-t", f"{self.session}:{window}", "-l", text)
        if enter:
            self.tmux("send-keys", "-t", f"{self.session}:{window}", "Enter")

    def interrupt(self, window: str) -> None:
        self.tmux("send-keys", "-t", f"{self.session}:{window}", "C-c")

    def type(self, command: str, timeout: float = 90, window: str = "main") -> tuple[int, str]:
        """Type a command line, wait for its end; its exit code and what it printed."""
        self.count += 1
        marker = f"@@done {self.count} rc="
        typed = f'echo "{marker}$?"'  # ends the typed line; the shell then prints the marker and the code
        self.keys(f"{command}; {typed}", window)
        pattern = re.compile(re.escape(marker) + r"(\d+)\s*$", re.MULTILINE)

        def finished() -> tuple[int, str] | None:
            text = self.screen(window)
            found = pattern.search(text)
            if not found:
                return None
            start = text.rfind(typed, 0, found.start())
            return int(found.group(1)), text[text.find("\n", start) + 1 : found.start()]

        return wait_until(
            finished, timeout, 0.2, what=lambda: f"`{command}` to finish; the screen:\n{self.screen(window)}"
        )

    def wait_for(self, pattern: str, window: str, timeout: float = 60) -> str:

        def shown() -> str | None:
            text = self.screen(window)
            return text if re.search(pattern, text) else None

        return wait_until(shown, timeout, 0.2, what=lambda: f"{pattern!r} on window {window}:\n{self.screen(window)}")


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[tuple[Terminal, Path]]:
    """A tmux session whose shell finds this venv's `dankserve` and the config of a swap group."""
    d = tmp_path
    write_host(d / "host.json")
    globals_ = {
        "state_dir": str(d / "state"),
        "cache_dir": str(d / "cache"),
        "hf_cache_dir": str(d / "hf"),
        "vllm_version": "0.33.0",
        "restart_backoff_initial_seconds": 0.2,
        "health_interval_seconds": 1.0,
        "stop_timeout_seconds": 10.0,
    }
    swap = {"swap_group": "g", "gpu_memory_utilization": 0.9}
    deployments = {
        "chat": process_deployment(free_port(), max_num_seqs=64, **swap),
        "code": process_deployment(free_port(), **swap),
    }
    config = write_config(d / "dankserve.toml", globals_, deployments)
    term = Terminal(Path("/tmp") / f"dankserve-tmux-{uuid.uuid4().hex[:8]}.sock", "ops")
    env = {
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
        "DANKSERVE_CONFIG": str(config),
        "DANKSERVE_HARDWARE": str(d / "host.json"),
        "HOME": str(d),
        "PS1": "$ ",
        "TERM": "xterm-256color",
        "NO_COLOR": "1",
        # the checkout under test, where the venv's `dankserve` is another checkout's editable install
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    shell = f"env -i {exports} bash --norc --noprofile"
    fresh = {k: v for k, v in env.items() if not k.startswith("DANKSERVE_")}
    fresh_shell = "env -i " + " ".join(f"{k}={shlex.quote(v)}" for k, v in fresh.items()) + " bash --norc --noprofile"
    term.tmux("new-session", "-d", "-s", term.session, "-n", "main", "-x", str(WIDTH), "-y", str(HEIGHT), shell)
    term.tmux("set-option", "-t", term.session, "history-limit", "20000")
    term.tmux("new-window", "-d", "-t", f"{term.session}:", "-n", "logs", shell)
    # a second terminal as a new one opens: without the first one's DANKSERVE_* exports
    term.tmux("new-window", "-d", "-t", f"{term.session}:", "-n", "other", fresh_shell)
    try:
        yield term, config
    finally:
        subprocess.run(
            [str(BIN / "dankserve"), "--config", str(config), "down"], check=False, capture_output=True, timeout=60
        )
        subprocess.run(["tmux", "-S", str(term.socket), "kill-server"], check=False, capture_output=True, timeout=10)
        term.socket.unlink(missing_ok=True)


def test_an_operator_session_at_a_terminal(terminal: tuple[Terminal, Path]) -> None:
    """up returns with a member asleep, logs -f follows a restart, a typo is refused and the fix accepted."""
    term, config = terminal

    rc, out = term.type("dankserve up", timeout=120)
    assert rc == 0, out
    assert re.search(r"chat\b.*\bready\b", out) and re.search(r"code\b.*\basleep\b", out), out

    rc, out = term.type("dankserve status")
    assert rc == 0, out
    rows = [line for line in out.splitlines() if re.match(r"\s*(chat|code)\s", line)]
    assert len(rows) == 2, out

    term.keys("dankserve logs -f", window="logs")
    term.wait_for(r"Application startup complete", "logs")
    rc, out = term.type("dankserve restart chat", timeout=120)
    assert rc == 0, out
    # the daemon's lines of the new boot and the new server's own lines, followed as they came
    followed = term.wait_for(r"(?s)started +boot=2 .*deployment=chat.*\bready\b.*deployment=chat", "logs", timeout=60)
    assert followed.count("Application startup complete") >= 2, followed
    term.interrupt("logs")

    # the server before the restart, alone: its boot, under the label of the previous server
    rc, out = term.type("dankserve logs --previous chat")
    assert rc == 0, out
    assert "dankserve-chat[-1]: " in out and "Application startup complete" in out, out
    assert not re.search(r"dankserve-chat: |dankserve: ", out), out

    # a second terminal without the exports is told why it reaches no daemon, then repeats them
    rc, out = term.type("dankserve status", window="other")
    assert rc == 2, out
    assert "config file /etc/dankserve/dankserve.toml does not exist" in out and "DANKSERVE_CONFIG" in out, out
    rc, out = term.type("dankserve down", window="other")
    assert rc == 2 and "does not exist" in out, out
    term.type(f"export DANKSERVE_CONFIG={shlex.quote(str(config))}", window="other")
    rc, out = term.type("dankserve status", window="other")
    assert rc == 0 and re.search(r"chat\b.*\bready\b", out), out

    term.type(f"sed -i 's/^max_num_seqs = 64$/max_num_seq = 64/' {config}")
    rc, out = term.type("dankserve reload")
    assert rc == 2, out
    assert "max_num_seq" in out and "max_num_seqs" in out, out  # names the key, suggests the right one
    rc, out = term.type("dankserve status")
    assert rc == 0, out
    assert "refused" in out and re.search(r"chat\b.*\bready\b", out), out

    term.type(f"sed -i 's/^max_num_seq = 64$/max_num_seqs = 32/' {config}")
    rc, out = term.type("dankserve reload", timeout=120)
    assert rc == 0, out
    assert "chat" in out and "accepted" in out, out

    rc, out = term.type("dankserve up", timeout=120)
    assert rc == 0, out
    assert re.search(r"code\b.*\basleep\b", out), out
    rc, out = term.type("dankserve status")
    assert "refused" not in out, out

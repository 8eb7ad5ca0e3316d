"""Issue 41 through dankserve's own daemon on a GPU with real vLLM: snapshots in the lifecycle.

The by-hand proof (snapshot_by_hand/) ran the capture's and the restore's steps itself; this runs
`dankserve run` (process runtime, `snapshot = "auto"`, the server keeping its host pids: docs/snapshots.md)
and only acts as a user would: it waits for the daemon's capture, then kills, restarts and stops, and
times each restart from the act to the first streamed token, checking the greedy ids every time.

  SNAPD_WORK   work directory (default /tmp/snapd; the state dir, caches, results.json)
  SNAPD_MODEL  the model's directory (make_qwen3.py's output)   SNAPD_LABEL  8b | 14b | ...
  SNAPD_EXECUTABLE  the deployment's `executable` (a Python with vLLM; default this Python)
  SNAPD_REPEATS  kill -9 restores (default 3)   SNAPD_EXTRA_ENV  JSON added to the deployment's env
  SNAPD_GLOBALS  extra top-level TOML lines (a rehearsal's recorded host needs none: DANKSERVE_HARDWARE)
  SNAPD_DEPLOYMENT_LINES  extra TOML lines of the deployment (`swap_group = "g"`: sleep mode with dev mode on TCP,
               so that vLLM 0.26's capture sleeps at level 2; without it the `room` step refuses the image)

    python3 bench/real_vllm/snapshot_daemon.py [STEPS]
    STEPS (comma-separated, default all): cold,captured,streams,kill,down_up,restart,daemon_restart,summary

Rehearse on a CPU machine first: bench/real_vllm/rehearse.py snapshot (the stand-in, a recorded host,
real CRIU). Results: WORK/results.json, and in $OUT results.json, boots.jsonl, status.json, plan.json,
doctor.txt, snapshots.json, daemon.log (tail), server.log (tail).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.real_vllm.proof import deployment_text, globals_text, healthy, stop_daemon
from dankserve import control as ctl

WORK = Path(os.environ.get("SNAPD_WORK", "/tmp/snapd"))
MODEL = os.environ.get("SNAPD_MODEL", "/tmp/q8b")
LABEL = os.environ.get("SNAPD_LABEL", Path(MODEL).name)
EXECUTABLE = os.environ.get("SNAPD_EXECUTABLE", sys.executable)
REPEATS = int(os.environ.get("SNAPD_REPEATS", "3"))
NAME, PORT = "chat", 8000
OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
T0 = time.monotonic()


def log(text: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {text}", flush=True)


def config_text() -> str:
    lines = [f'model = "{MODEL}"', 'runtime = "process"', f'executable = "{EXECUTABLE}"', 'snapshot = "auto"']
    lines += os.environ.get("SNAPD_DEPLOYMENT_LINES", "").splitlines()
    extra_globals = os.environ.get("SNAPD_GLOBALS", "")
    return globals_text(WORK) + f"{extra_globals}\n" + deployment_text(NAME, lines, PORT, "SNAPD_EXTRA_ENV")


# --- the daemon, as a user drives it --------------------------------------------------------------------


def dankserve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dankserve", "--config", str(WORK / "dankserve.toml"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def control(message: dict[str, Any], timeout: float = 900) -> dict[str, Any] | None:
    return ctl.request(ctl.socket_path(WORK / "state"), message, timeout=timeout)


def status() -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        reply = control({"command": "status"}, timeout=10)
        if reply and reply.get("ok"):
            return next((d for d in reply["status"]["deployments"] if d["name"] == NAME), None)
    return None


def wait_status(predicate: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = status()
        if last is not None and predicate(last):
            return last
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}; last status {json.dumps(last)[:2000]}")


def start_daemon() -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "dankserve", "--config", str(WORK / "dankserve.toml"), "run"]
    with (WORK / "daemon.log").open("ab") as out:
        daemon = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    (WORK / "daemon.pid").write_text(str(daemon.pid))
    return daemon


def daemon_pid() -> int:
    return int((WORK / "daemon.pid").read_text())


def server_pid() -> int:
    pid: int = json.loads((WORK / "state" / "processes" / f"{NAME}.json").read_text())["pid"]
    return pid


def current_server() -> tuple[int, str] | None:
    """The recorded server's pid and start time: a restore brings the tree back with its own pids, so the
    start time tells the restored server from the killed one."""
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
        pid = server_pid()
        return pid, Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    return None


def boot_kind(s: dict[str, Any]) -> str | None:
    return (s.get("last_boot") or {}).get("kind")


# --- the client's view ----------------------------------------------------------------------------------


def greedy_ids() -> list[int]:
    """16 greedy token ids (ignore_eos: the random-weight model may stop at once)."""
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}
    body |= {"ignore_eos": True, "return_token_ids": True}
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        reply = json.loads(conn.getresponse().read())
        return list(reply["choices"][0]["token_ids"])
    finally:
        conn.close()


def wait_gone(old: tuple[int, str] | None, timeout: float = 60) -> None:
    """Until the old server no longer answers (so a first token is the new one's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and healthy():
        if current_server() not in (None, old):
            return
        time.sleep(0.01)


def first_token_at() -> float:
    """Polls a streamed completion until its first token arrives (time.monotonic()); refused connections
    and errors while the server is away are retried every 20 ms."""
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True})
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            if reply.status == 200:
                while line := reply.readline():
                    if line.startswith(b"data: {"):
                        return time.monotonic()
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.02)


async def _streams(count: int) -> dict[str, Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="none", max_retries=0, timeout=120)

    async def one(i: int) -> int:
        stream = await client.completions.create(
            model=MODEL, prompt=f"Request {i}:", max_tokens=32, temperature=0, stream=True
        )
        chunks = 0
        async for _ in stream:
            chunks += 1
        return chunks

    started = time.monotonic()
    answers = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
    errors = [repr(a) for a in answers if isinstance(a, BaseException)]
    await client.close()
    return {
        "streams": count,
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(time.monotonic() - started, 2),
    }


# --- results --------------------------------------------------------------------------------------------


def results() -> dict[str, Any]:
    path = WORK / "results.json"
    loaded: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return loaded


def record(key: str, value: dict[str, Any], boot_seconds: float | None = None) -> None:
    data = results()
    data.setdefault(key, []).append(value)
    (WORK / "results.json").write_text(json.dumps(data, indent=2))
    if boot_seconds is not None:
        row = {"kind": key, "model": LABEL, "seconds": boot_seconds, **value}
        with (WORK / "boots.jsonl").open("a") as rows:
            rows.write(json.dumps(row) + "\n")
    log(f"== {key}: {json.dumps(value)}")
    copy_out()


def copy_out() -> None:
    if OUT is None:
        return
    for name in ("results.json", "boots.jsonl"):
        if (WORK / name).exists():
            shutil.copy(WORK / name, OUT / name)


def last_backoff(since: float) -> float | None:
    """The failure policy's delay before this restart (`restart_scheduled`, logged after `since`, epoch):
    kills in quick succession are a crash loop to it, so the 2nd and 3rd wait 2.8 s and 4.2 s first."""
    from datetime import datetime

    found = None
    path = WORK / "daemon.log"
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            item = json.loads(line)
            at = datetime.fromisoformat(item["timestamp"].replace("Z", "+00:00")).timestamp()
            if item.get("event") == "restart_scheduled" and at >= since:
                found = float(item["delay_seconds"])
    return found


def restart_by(label: str, act: Any) -> None:
    """Does `act`, then times the way back: to READY with the boot kind `restore` (status), and to the first
    streamed token; the greedy ids must be the captured ones."""
    old = current_server()
    acted, acted_epoch = time.monotonic(), time.time()
    act()
    wait_gone(old)
    token = first_token_at() - acted
    after = wait_status(lambda s: s["state"] == "ready" and current_server() not in (None, old), 300, f"{label}: ready")
    ids = greedy_ids()
    reference = results()["captured"][0]["ids"]
    snap = after.get("snapshot") or {}
    value = {
        "first_token_seconds": round(token, 2),
        "boot_kind": boot_kind(after),
        "boot_seconds": (after.get("last_boot") or {}).get("seconds"),
        "last_restore_seconds": snap.get("last_restore_seconds"),
        "snapshot_state": snap.get("state"),
        "same_ids": ids == reference,
        "restarts": after.get("restarts"),
        "last_failure": snap.get("last_failure"),
        "policy_backoff_seconds": last_backoff(acted_epoch),
    }
    record(label, value, boot_seconds=round(token, 2))
    if value["boot_kind"] != "restore" or not value["same_ids"]:
        log(f"!! {label}: not a restore with the same ids: {json.dumps(after)[:3000]}")


# --- the steps ------------------------------------------------------------------------------------------


def step_cold() -> None:
    shutil.rmtree(WORK / "state", ignore_errors=True)
    plan = dankserve("plan", NAME, "--json")
    (WORK / "plan.json").write_text(plan.stdout + plan.stderr)
    doctor = dankserve("doctor")
    (WORK / "doctor.txt").write_text(doctor.stdout + doctor.stderr + f"\nexit {doctor.returncode}\n")
    if OUT is not None:
        shutil.copy(WORK / "plan.json", OUT / "plan.json")
        shutil.copy(WORK / "doctor.txt", OUT / "doctor.txt")
    if plan.returncode != 0:
        raise SystemExit(f"plan failed: {plan.stdout}{plan.stderr}")
    start_daemon()
    # READY (the boot's own seconds, from status); no request meanwhile: the capture starts at once, and a
    # client connected straight to the server keeps it from being captured (docs/snapshots.md).
    ready = wait_status(lambda s: boot_kind(s) is not None, 900, "the cold boot")
    seconds = (ready.get("last_boot") or {}).get("seconds")
    record("cold", {"boot_seconds": seconds, "boot_kind": boot_kind(ready)}, boot_seconds=seconds)


def step_captured() -> None:
    s = wait_status(lambda s: (s.get("snapshot") or {}).get("state") in ("ready", "off", "failed"), 300, "the capture")
    snap = s.get("snapshot") or {}
    listed = dankserve("snapshot", "list", "--json")
    (WORK / "snapshots.json").write_text(listed.stdout + listed.stderr)
    entries = json.loads(listed.stdout).get("snapshots", []) if listed.returncode == 0 else []
    size = next((e.get("bytes") for e in entries if e.get("deployment") == NAME), None)
    ids = greedy_ids()
    record(
        "captured",
        {
            "state": snap.get("state"),
            "reason": snap.get("reason"),
            "outage_seconds": snap.get("last_capture_outage_seconds"),
            "bytes": size,
            "ids": ids,
            "pid": server_pid(),
        },
    )
    if snap.get("state") != "ready":
        raise SystemExit(f"not captured: {json.dumps(s)[:3000]}")


def step_streams() -> None:
    record("streams", asyncio.run(_streams(50)))


def step_kill() -> None:
    for i in range(REPEATS):
        restart_by("kill9", lambda: os.kill(server_pid(), signal.SIGKILL))
        log(f"kill {i + 1} done")


def step_down_up() -> None:
    def act() -> None:
        control({"command": "down", "deployment": NAME}, timeout=120)
        control({"command": "up", "deployment": NAME}, timeout=10)

    restart_by("down_up", act)


def step_restart() -> None:
    restart_by("restart", lambda: control({"command": "restart", "deployment": NAME}, timeout=10))


def step_daemon_restart() -> None:
    """The daemon stopped as systemd stops it (SIGTERM: its servers stop too), then started again: a
    host restart's path."""

    def act() -> None:
        stop_daemon(daemon_pid(), poll=0.05)
        start_daemon()

    restart_by("daemon_restart", act)


def step_summary() -> None:
    s = status()
    (WORK / "status.json").write_text(json.dumps(s, indent=2))
    shown = dankserve("status", NAME)
    (WORK / "status.txt").write_text(shown.stdout + shown.stderr)
    listed = dankserve("snapshot", "list")
    (WORK / "status.txt").open("a").write("\n" + listed.stdout + listed.stderr)
    rows = results()
    table = [("step", "first token s", "boot kind", "restore s", "same ids", "backoff s")]
    for key in ("cold", "kill9", "down_up", "restart", "daemon_restart"):
        for row in rows.get(key, []):
            table.append(
                (
                    key,
                    str(row.get("first_token_seconds")),
                    str(row.get("boot_kind")),
                    str(row.get("last_restore_seconds")),
                    str(row.get("same_ids", "")),
                    str(row.get("policy_backoff_seconds", "")),
                )
            )
    for line in table:
        print(f"{line[0]:<16}{line[1]:>14}{line[2]:>14}{line[3]:>12}{line[4]:>10}{line[5]:>11}")
    captured = rows.get("captured", [{}])[0]
    print(
        f"capture outage {captured.get('outage_seconds')} s, image {captured.get('bytes')} bytes;",
        f"streams {rows.get('streams')}",
    )
    if OUT is not None:
        for name in ("status.json", "status.txt", "snapshots.json"):
            if (WORK / name).exists():
                shutil.copy(WORK / name, OUT / name)


def stop_all() -> None:
    with contextlib.suppress(OSError, ValueError):
        os.kill(daemon_pid(), signal.SIGTERM)
    time.sleep(5)


def keep_logs() -> None:
    if OUT is None:
        return
    for name, src in (
        ("daemon.log", WORK / "daemon.log"),
        ("server.log", WORK / "state" / "processes" / f"{NAME}.log"),
    ):
        if src.exists():
            data = src.read_bytes()
            (OUT / name).write_bytes(data[-400_000:])


STEPS = {
    "cold": step_cold,
    "captured": step_captured,
    "streams": step_streams,
    "kill": step_kill,
    "down_up": step_down_up,
    "restart": step_restart,
    "daemon_restart": step_daemon_restart,
    "summary": step_summary,
}


def main() -> int:
    steps = (sys.argv[1] if len(sys.argv) > 1 else "all").split(",")
    steps = list(STEPS) if steps == ["all"] else steps
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "dankserve.toml").write_text(config_text())
    code = 0
    try:
        for name in steps:
            t0 = time.monotonic()
            STEPS[name]()
            log(f"-- step {name} took {time.monotonic() - t0:.1f}s")
    except SystemExit as exc:
        log(f"!! stopped: {exc}")
        code = 1
    finally:
        keep_logs()
        if "stop" in os.environ.get("SNAPD_AT_END", "stop"):
            stop_all()
            keep_logs()
    return code


if __name__ == "__main__":
    raise SystemExit(main())

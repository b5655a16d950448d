"""Runs README and docs snippets as written, inside a private network namespace.

``tests/cluster/test_readme.py`` starts ``unshare --net python -m
tests.support.readme_driver SCENARIO WORKDIR`` with the snippets in a JSON file:
the namespace has its own loopback, so the README's fixed default ports (7101, 7201,
7001..7103 ...) are free and nothing outside is touched. The driver runs the commands
in WORKDIR, where ``.venv`` is the test's venv (the snippets say ``.venv/bin/raftsched``
or activate it, as in a clone), cleans up every process it started, prints progress,
and writes what it saw to ``WORKDIR/result.json``; the test asserts. The README's tour
and the example apps run in a *fresh* shell: the venv is not on their PATH, so a
snippet that calls ``raftsched`` without activating it fails here as it would for a
reader. The other snippets follow the tour in the same (activated) shell: they run
with the venv on PATH.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from typing import Any

from tests.support.harness import json_lines, wait_until

#: Bound for one shell command of a snippet.
CMD_TIMEOUT_S = 60


def say(text: str) -> None:
    """Progress on stderr: the test shows it when a scenario fails."""
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


def sh(cmd: str, cwd: str, env: dict[str, str], check: bool = True,
       timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    say(f"$ {cmd}\n-> {proc.returncode}\n{proc.stdout}{proc.stderr}")
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd!r} exited {proc.returncode}: {proc.stderr}")
    return proc


def link_venv(folder: str) -> None:
    """``folder/.venv`` is this venv, as the clone's ``.venv`` is the reader's."""
    link = os.path.join(folder, ".venv")
    if not os.path.lexists(link):
        os.symlink(sys.prefix, link)


def fresh(env: dict[str, str]) -> dict[str, str]:
    """``env`` as a new terminal has it: the venv neither on PATH nor active."""
    bindir = os.path.dirname(sys.executable)
    out = {k: v for k, v in env.items() if k != "VIRTUAL_ENV"}
    out["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and os.path.realpath(p) != os.path.realpath(bindir))
    return out


def strip_comment(line: str) -> str:
    """The command of a snippet line without its trailing ``# ...`` comment."""
    return shlex.join(shlex.split(line, comments=True))


def spawn(cmd: str, cwd: str, env: dict[str, str], log: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def status_json(cwd: str, env: dict[str, str]) -> dict[str, Any] | None:
    proc = subprocess.run(["raftsched", "status", "--json"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        return None
    return out if isinstance(out, dict) and "health" in out else None


def healthy(cwd: str, env: dict[str, str]) -> dict[str, Any] | None:
    st = status_json(cwd, env)
    return st if st and st["health"] == "ok" else None


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode


def kill_pids(pids: set[int]) -> None:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"raftsched" not in f.read():
                    continue
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


# ---------------------------------------------------------------- scenarios

def tour(work: str, env: dict[str, str], snip: dict[str, Any]) -> dict[str, Any]:
    """``.venv/bin/raftsched node`` (the install block's last command), the tour block,
    both in fresh shells; then the commands of the sample-output blocks; the node stops
    cleanly on SIGTERM."""
    node = spawn(snip["node_cmd"], work, fresh(env), os.path.join(work, "node.log"))
    try:
        wait_until(lambda: healthy(work, env), 60, "the embedded default node healthy")
        sh(snip["tour"], work, fresh(env))

        def six_done() -> bool:
            runs = json.loads(sh("raftsched runs hello --json", work, env).stdout)["runs"]
            done = [r for r in runs if r["state"] == "succeeded"]
            # The metrics sample is "after six runs of hello"; the newest keep their output.
            return len(done) >= 6 and bool(done[0]["tail"])

        wait_until(six_done, 60, "six runs of hello, the newest with its output")
        outputs = {cmd: sh(cmd, work, env, check=False).stdout for cmd in snip["samples"]}
        events = [e for e in json_lines(os.path.join(work, "node.log"))
                  if e.get("event") == "run.started"]
    finally:
        code = stop(node)
    return {"outputs": outputs, "node_exit": code, "run_started": events[:1]}


def local(work: str, env: dict[str, str], snip: dict[str, Any]) -> dict[str, Any]:
    """The ``raftsched local`` block line by line (the first runs in the background, as
    in its own terminal; ``<pid of the leader>`` is the leader's pid from status), then
    the Python client block against that cluster."""
    lines = [ln for ln in snip["local"].splitlines() if ln.strip()]
    with open(os.path.join(work, "hello.toml"), "w", encoding="utf-8") as f:
        f.write(snip["hello_toml"])
    feed_path = os.path.join(work, "feed.log")
    proc = spawn(strip_comment(lines[0]), work, env, feed_path)
    pids: set[int] = set()
    env = dict(env)
    try:
        for line in lines[1:]:
            cmd = strip_comment(line.replace("<pid of the leader>", "PID_OF_THE_LEADER"))
            if cmd.startswith("export "):
                name, _, value = cmd[len("export "):].partition("=")
                env[name] = value

                def pids_known() -> bool:
                    st = healthy(work, env)
                    return st is not None and all(n.get("pid") for n in st["nodes"])

                wait_until(pids_known, 60, "the local cluster healthy, every node's pid known")
            elif "PID_OF_THE_LEADER" in cmd:  # the README's placeholder, filled in here
                st = wait_until(lambda: healthy(work, env), 30, "a leader")
                pids.update(n["pid"] for n in st["nodes"])
                leader = next(n for n in st["nodes"] if n["node_id"] == st["leader"])
                mark = len(open(feed_path, encoding="utf-8", errors="replace").read())
                sh(cmd.replace("PID_OF_THE_LEADER", str(leader["pid"])), work, env)

                def after_kill(mark: int = mark) -> str:
                    with open(feed_path, encoding="utf-8", errors="replace") as f:
                        return f.read()[mark:]

                def recovered() -> bool:
                    text = after_kill()
                    changed = re.search(r"leader\.changed .*leader=n\d", text)
                    return "restarted (pid" in text and changed is not None and re.search(
                        r"run\.started +hello@", text[changed.end():]) is not None

                wait_until(recovered, 60, "death, new leader, next run and restart in the feed")
                wait_until(lambda: healthy(work, env), 60, "the cluster ok again")
            else:
                sh(cmd, work, env)
        client = subprocess.run([sys.executable, "-c", snip["client"]], cwd=work, env=env,
                                capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
        say(f"python client block -> {client.returncode}\n{client.stdout}{client.stderr}")
        st = status_json(work, env) or {}
        pids.update(n["pid"] for n in st.get("nodes", []) if n.get("pid"))
    finally:
        code = stop(proc, signal.SIGINT)
        kill_pids(pids)
    with open(feed_path, encoding="utf-8", errors="replace") as f:
        feed = f.read()
    return {"feed": feed, "local_exit": code, "client_rc": client.returncode,
            "client_out": client.stdout, "client_err": client.stderr}


def embedded(work: str, env: dict[str, str], snip: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", snip["embedded"]], cwd=work, env=env,
                          capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    say(f"python embedded block -> {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return {"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr}


def http(work: str, env: dict[str, str], snip: dict[str, Any]) -> dict[str, Any]:
    """``raftsched local`` (the local block's first line) with hello put and running,
    then the HTTP block and the schedule-preview block as scripts, then the commands of
    the preview's sample-output block."""
    with open(os.path.join(work, "hello.toml"), "w", encoding="utf-8") as f:
        f.write(snip["hello_toml"])
    proc = spawn(strip_comment(snip["local_line"]), work, env,
                 os.path.join(work, "feed.log"))
    pids: set[int] = set()
    try:
        wait_until(lambda: healthy(work, env), 60, "the local cluster healthy")
        sh("raftsched job put hello.toml", work, env)

        def two_runs() -> bool:
            runs = json.loads(sh("raftsched runs hello --json", work, env).stdout)["runs"]
            return len([r for r in runs if r["state"] == "succeeded"]) >= 2

        wait_until(two_runs, 60, "two runs of hello")
        http_out = sh(snip["http"], work, env).stdout
        preview_out = sh(snip["preview"], work, env).stdout
        outputs = {cmd: sh(cmd, work, env, check=False).stdout for cmd in snip["samples"]}
        st = status_json(work, env) or {}
        pids.update(n["pid"] for n in st.get("nodes", []) if n.get("pid"))
    finally:
        code = stop(proc, signal.SIGINT)
        kill_pids(pids)
    return {"http_out": http_out, "preview_out": preview_out, "outputs": outputs,
            "local_exit": code}


def security(work: str, env: dict[str, str], snip: dict[str, Any]) -> dict[str, Any]:
    """The TLS block, then the rotation block, as one bash script (the node the first
    starts in the background serves the second); then the completion block with HOME
    in the work dir. Every process of the script's session is killed at the end."""
    with open(os.path.join(work, "hello.toml"), "w", encoding="utf-8") as f:
        f.write(snip["hello_toml"])
    script = snip["tls"] + "\n" + snip["rotate"]
    with open(os.path.join(work, "script.log"), "wb") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=150)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
    with open(os.path.join(work, "script.log"), encoding="utf-8", errors="replace") as f:
        out_text = f.read()
    say(f"security script -> {rc}\n{out_text}")
    node_log = ""
    if os.path.exists(os.path.join(work, "node.log")):
        with open(os.path.join(work, "node.log"), encoding="utf-8", errors="replace") as f:
            node_log = f.read()
    home = os.path.join(work, "home")
    os.makedirs(home)
    comp = sh(snip["completion"], work, dict(env, HOME=home), check=False)
    files = {p: os.path.getsize(os.path.join(home, p)) for p in
             (".local/share/bash-completion/completions/raftsched", ".zfunc/_raftsched")
             if os.path.exists(os.path.join(home, p))}
    return {"rc": rc, "out": out_text, "node_log": node_log, "completion_rc": comp.returncode,
            "completion_files": files}


def examples(work: str, env: dict[str, str], snip: dict[str, Any]) -> dict[str, Any]:
    """The example-app blocks given (``run3``, ``gunicorn``) as written, in a fresh shell,
    from a stand-in for the clone (its ``examples`` and ``.venv``; their files in
    WORKDIR, a folder of ``work`` each)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    clone = os.path.join(work, "clone")
    os.makedirs(clone, exist_ok=True)
    link_venv(clone)
    if not os.path.lexists(os.path.join(clone, "examples")):
        os.symlink(os.path.join(root, "examples"), os.path.join(clone, "examples"))
    out: dict[str, Any] = {}
    for name in [n for n in ("run3", "gunicorn") if n in snip]:
        run_env = dict(fresh(env), WORKDIR=os.path.join(work, name))
        proc = sh(snip[name], clone, run_env, check=False, timeout=120)
        out[name] = {"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr[-3000:]}
    return out


SCENARIOS = {"tour": tour, "local": local, "embedded": embedded, "http": http,
             "security": security, "examples": examples}


def main() -> int:
    scenario, work = sys.argv[1], sys.argv[2]
    with open(os.path.join(work, "snippets.json"), encoding="utf-8") as f:
        snip = json.load(f)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    link_venv(work)
    env = dict(os.environ)
    env.pop("RAFTSCHED_ADDR", None)
    result = SCENARIOS[scenario](work, env, snip)
    with open(os.path.join(work, "result.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

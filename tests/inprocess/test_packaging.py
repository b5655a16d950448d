"""Issue 16 item 9: ``--version``, the systemd unit, the Dockerfile, shell completion.

The unit is checked by ``systemd-analyze verify`` (with ExecStart pointed at this venv's
``raftsched``; a warning fails it too). The Dockerfile's install step must be the
README's install command; it is built only where a container engine answers (not on
the build machine: a docker client without a daemon, and no registry to pull a base
image from). Completion scripts come from the argparse definition (shtab); bash's is
loaded into a real bash and asked to complete.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.harness import ROOT

pytestmark = pytest.mark.timeout(120)

RAFTSCHED = os.path.join(os.path.dirname(sys.executable), "raftsched")


def _readme_install() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"```bash\n(python3 -m venv \.venv && \.venv/bin/pip install -q -c "
                  r"constraints\.txt -e \. && \.venv/bin/raftsched node)\n```", text)
    assert m, "README lost its install command"
    return m.group(1)


def test_version_is_the_package_version() -> None:
    out = subprocess.run([RAFTSCHED, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and re.fullmatch(r"raftsched \d+\.\d+\.\d+\S*\n", out.stdout)


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd); "
                    ".ci/run installs it when run as root")
    with open(os.path.join(ROOT, "deploy", "raftsched@.service"), encoding="utf-8") as f:
        unit = f.read()
    assert "ExecStart=/opt/raftsched/.venv/bin/raftsched node --config " in unit
    # verify checks that ExecStart's program exists: point it at this venv's.
    path = tmp_path / "raftsched@n1.service"
    path.write_text(unit.replace("/opt/raftsched/.venv/bin/raftsched", RAFTSCHED))
    res = subprocess.run([tool, "verify", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    # Warnings (an unknown key, a bad value) do not change the exit code: none allowed.
    lines = [ln for ln in res.stderr.splitlines() if path.name in ln or "raftsched" in ln]
    assert lines == [], res.stderr


def test_the_dockerfile_installs_with_the_readme_command(tmp_path) -> None:
    with open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8") as f:
        dockerfile = f.read()
    install = _readme_install().rsplit(" && ", 1)[0]  # without starting the node
    runs = [ln[4:].strip() for ln in dockerfile.splitlines() if ln.startswith("RUN ")]
    assert runs[0] == install, (runs, install)
    assert 'ENTRYPOINT ["/opt/raftsched/.venv/bin/raftsched"]' in dockerfile
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True,
                                        timeout=30).returncode != 0:
        pytest.skip("no container engine answers here (docker client without a daemon); "
                    "the image was not built")
    res = subprocess.run([docker, "build", "-q", "-t", "raftsched-test", ROOT],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = subprocess.run([docker, "run", "--rm", "raftsched-test", "--version"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("raftsched "), out


def test_bash_completion_completes_commands_and_options() -> None:
    script = subprocess.run([RAFTSCHED, "completion", "bash"], capture_output=True, text=True,
                            timeout=60)
    assert script.returncode == 0 and "complete " in script.stdout

    def complete(words: list[str]) -> list[str]:
        # What bash does on TAB: COMP_WORDS/COMP_CWORD set, the registered function run.
        words_s = " ".join(f"'{w}'" for w in words)
        prog = (f'source /dev/stdin; fn=$(complete -p raftsched | sed -E "s/.*-F ([^ ]+).*/\\1/");'
                f" COMP_WORDS=({words_s}); COMP_CWORD={len(words) - 1};"
                f' COMP_LINE="{" ".join(words)}"; COMP_POINT=${{#COMP_LINE}};'
                f' $fn raftsched "{words[-1]}" "{words[-2]}"; printf "%s\\n" "${{COMPREPLY[@]}}"')
        res = subprocess.run(["bash", "-c", prog], input=script.stdout, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    assert {"job", "jobs"} & set(complete(["raftsched", "jo"])) == {"job"}
    assert "certs" in complete(["raftsched", "ce"])
    assert "put" in complete(["raftsched", "job", "p"])
    assert "--tls-ca" in complete(["raftsched", "status", "--tl"])


def test_zsh_completion_is_generated_and_parses() -> None:
    script = subprocess.run([RAFTSCHED, "completion", "zsh"], capture_output=True, text=True,
                            timeout=60)
    assert script.returncode == 0 and script.stdout.startswith("#compdef raftsched")
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed: the script was generated but not parsed")
    res = subprocess.run([zsh, "-n"], input=script.stdout, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr

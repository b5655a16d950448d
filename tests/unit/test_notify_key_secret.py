"""Issue 29 item 9: ``notify-key`` finds the secret as every other command does."""

from __future__ import annotations

import os

import pytest

from raftsched.faces.cli import build_parser
from raftsched.faces.cli_notify import find_secret
from raftsched.wire.secretfile import RUNTIME_DIR_ENV, load_or_create_secret, register


@pytest.fixture
def no_secret_env(monkeypatch):
    for name in ("RAFTSCHED_SECRET", "RAFTSCHED_SECRET_FILE", "RAFTSCHED_ADDR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_secret_file_variable_is_read(tmp_path, no_secret_env) -> None:
    secret, path = load_or_create_secret(str(tmp_path))
    no_secret_env.setenv("RAFTSCHED_SECRET_FILE", path)
    assert find_secret(build_parser().parse_args(["notify-key"])) == secret


def test_the_variable_wins(tmp_path, no_secret_env) -> None:
    _, path = load_or_create_secret(str(tmp_path))
    no_secret_env.setenv("RAFTSCHED_SECRET_FILE", path)
    no_secret_env.setenv("RAFTSCHED_SECRET", "x" * 40)
    assert find_secret(build_parser().parse_args(["notify-key"])) == "x" * 40


def test_a_local_nodes_generated_secret_is_found(tmp_path, no_secret_env) -> None:
    """What `raftsched node` leaves for its user: a pointer from its API address to the
    secret it generated (the case the issue met: every other command found it)."""
    runtime = tmp_path / "run"
    no_secret_env.setenv(RUNTIME_DIR_ENV, str(runtime))
    secret, path = load_or_create_secret(str(tmp_path / "data"))
    register("127.0.0.1:7345", path)
    args = build_parser().parse_args(["notify-key", "--addr", "127.0.0.1:7345"])
    assert find_secret(args) == secret
    other = build_parser().parse_args(["notify-key", "--addr", "127.0.0.1:7346"])
    assert find_secret(other) is None
    assert sorted(os.listdir(runtime)) == ["127.0.0.1_7345"]


@pytest.mark.parametrize("how", ["comma", "repeated", "env"])
def test_every_address_is_looked_up_as_the_client_dials_each(tmp_path, no_secret_env, capsys,
                                                             how) -> None:
    """The first node of the list is down (its pointer went with it): the client would
    reach the second and prove the secret its node registered; so does notify-key."""
    from raftsched.faces.cli import main
    from raftsched.wire.webhook import notify_key

    no_secret_env.setenv(RUNTIME_DIR_ENV, str(tmp_path / "run"))
    secret, path = load_or_create_secret(str(tmp_path / "data"))
    register("127.0.0.1:7352", path)
    addrs = {"comma": ["--addr", "127.0.0.1:7351,127.0.0.1:7352"],
             "repeated": ["--addr", "127.0.0.1:7351", "--addr", "127.0.0.1:7352"],
             "env": []}[how]
    if how == "env":
        no_secret_env.setenv("RAFTSCHED_ADDR", "127.0.0.1:7351,127.0.0.1:7352")
    assert main(["notify-key", *addrs]) == 0
    assert capsys.readouterr().out == notify_key(secret) + "\n"

"""Issue 29 item 1: every command's ``--timeout`` defaults to 10 s, as ``--help`` says.

``backup`` (120 s), ``cluster add-node`` (90 s) and ``cluster remove-node`` (150 s)
have their own defaults; argparse shares the common parent's ``--timeout`` action among
the subparsers, so setting one command's default through that action changed every
command's (``job ls`` against frozen nodes hung 120 s).
"""

from __future__ import annotations

import pytest

from raftsched.faces.cli import build_parser
from raftsched.faces.cli_common import command_timeout


@pytest.mark.parametrize("argv", [["job", "ls"], ["status"], ["runs", "x"],
                                  ["job", "put", "f.toml"], ["job", "get", "x"]])
def test_client_commands_default_to_ten_seconds(argv) -> None:
    assert command_timeout(build_parser().parse_args(argv)) == 10.0


@pytest.mark.parametrize("argv, seconds", [
    (["backup", "out.bin"], 120.0),
    (["cluster", "add-node", "n4", "--raft", "h:1", "--api", "h:2"], 90.0),
    (["cluster", "remove-node", "n4"], 150.0)])
def test_long_commands_keep_their_own_default(argv, seconds) -> None:
    assert command_timeout(build_parser().parse_args(argv)) == seconds


def test_an_explicit_timeout_wins_everywhere() -> None:
    parser = build_parser()
    assert command_timeout(parser.parse_args(["status", "--timeout", "3"])) == 3.0
    assert command_timeout(parser.parse_args(["backup", "o", "--timeout", "7"])) == 7.0

"""Tests for raftsched.node.config.config: the example file, defaults, and every rejection
naming its key."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core.errors import ConfigError
from raftsched.node.config.config import (
    DEFAULT_API_ADDR,
    DEFAULT_DURABILITY,
    DEFAULT_METRICS_ADDR,
    DEFAULT_RAFT_ADDR,
    DEFAULT_SECRET_ENV,
    MIN_SECRET_LEN,
    ClusterConfig,
    Limits,
    LogConfig,
    Timing,
    check_bind_safety,
    embedded_default,
    is_loopback,
    load_config,
    parse_config,
    resolve_secret,
    split_addr,
)
from raftsched.node.config.notifyconfig import NotifyConfig
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(30)

EXAMPLE = Path(__file__).resolve().parents[2] / "cluster.example.toml"
SECRET = "s3cr3t-VALUE-never-printed-0123456789"


def base() -> dict[str, Any]:
    """A valid 3-node config as tomllib would return it."""
    return {
        "cluster": {"data_dir": "/var/lib/rs", "secret_env": "RS_SECRET"},
        "nodes": [
            {"id": f"n{i}", "raft": f"127.0.0.1:700{i}", "api": f"127.0.0.1:710{i}",
             "metrics": f"127.0.0.1:720{i}"}
            for i in (1, 2, 3)
        ],
    }


def public(i: int) -> dict[str, Any]:
    """A node on routable addresses (different machines, same ports)."""
    return {"id": f"p{i}", "raft": f"10.0.0.{i}:7001", "api": f"10.0.0.{i}:7101",
            "metrics": f"10.0.0.{i}:7201"}


def with_(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation setting a dotted path ("nodes.1.workers") in the base dict."""
    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[int(p)] if p.isdigit() else d.setdefault(p, {})
        d[int(last) if last.isdigit() else last] = value
    return mutate


def without(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[int(p)] if p.isdigit() else d[p]
        del d[int(last) if last.isdigit() else last]
    return mutate


def parse_mutated(mutate: Callable[[dict[str, Any]], None]) -> ClusterConfig:
    d = base()
    mutate(d)
    return parse_config(d)


# -------------------------------------------------------------- good configs


def test_example_file_parses_as_a_three_node_loopback_cluster() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.source == str(EXAMPLE)
    assert [n.id for n in cfg.nodes] == ["n1", "n2", "n3"]
    assert [n.raft for n in cfg.nodes] == [f"127.0.0.1:700{i}" for i in (1, 2, 3)]
    assert [n.api for n in cfg.nodes] == [f"127.0.0.1:710{i}" for i in (1, 2, 3)]
    assert [n.metrics for n in cfg.nodes] == [f"127.0.0.1:720{i}" for i in (1, 2, 3)]
    assert cfg.nodes[0].tags == ("linux",)
    assert cfg.secret_env == DEFAULT_SECRET_ENV
    for n in cfg.nodes:
        check_bind_safety(cfg, n.id, None)  # loopback: fine without a secret


def test_example_file_documents_the_real_defaults() -> None:
    # The example sets every optional key to its default; if a default changes,
    # the file (which operators read as documentation) must change with it.
    cfg = load_config(EXAMPLE)
    assert cfg.limits == Limits()
    assert cfg.timing == Timing()
    assert cfg.log == LogConfig()
    assert cfg.notify == NotifyConfig()
    assert cfg.allowed_call_prefixes == ()
    assert cfg.durability == DEFAULT_DURABILITY == "sync"
    assert all(n.workers == 4 and n.queue == 16 for n in cfg.nodes)


def test_durability_is_sync_or_none_and_a_typo_names_the_key() -> None:
    for mode in ("sync", "none", "SYNC"):
        cfg = base()
        cfg["cluster"]["durability"] = mode
        assert parse_config(cfg).durability == mode.lower()
    assert parse_config(base()).durability == "sync"
    cfg = base()
    cfg["cluster"]["durability"] = "fsync"
    with pytest.raises(ConfigError) as info:
        parse_config(cfg)
    assert info.value.key == "cluster.durability" and "sync, none" in str(info.value)


def test_embedded_default() -> None:
    cfg = embedded_default()
    assert cfg.source == "<embedded>"
    assert cfg.data_dir == "./raftsched-data"
    assert cfg.secret_env == "RAFTSCHED_SECRET"
    (n,) = cfg.nodes
    assert (n.id, n.raft, n.api, n.metrics) == ("n1", DEFAULT_RAFT_ADDR, DEFAULT_API_ADDR,
                                               DEFAULT_METRICS_ADDR)
    assert (n.raft, n.api, n.metrics) == ("127.0.0.1:7001", "127.0.0.1:7101", "127.0.0.1:7201")
    assert n.workers == 4 and n.queue == 16 and n.tags == ()
    assert cfg.limits == Limits() and cfg.timing == Timing() and cfg.log == LogConfig()
    assert embedded_default("/tmp/x").node_data_dir("n1") == "/tmp/x/n1"
    check_bind_safety(cfg, "n1", None)


def test_defaults_fill_missing_optional_keys() -> None:
    d = {"cluster": {"data_dir": "d"}, "nodes": [{"id": "a", "raft": "h:1", "api": "h:2"}]}
    cfg = parse_config(d)
    assert cfg.source == "<dict>"
    assert cfg.secret_env == "RAFTSCHED_SECRET"
    n = cfg.nodes[0]
    assert n.metrics is None and n.workers == 4 and n.queue == 16 and n.tags == ()
    d["nodes"][0]["workers"] = 10
    assert parse_config(d).nodes[0].queue == 40  # queue follows workers unless set
    d["nodes"][0]["queue"] = 0
    assert parse_config(d).nodes[0].queue == 0


def test_durations_and_values_are_read() -> None:
    d = base()
    d["timing"] = {"node_timeout": "1m", "heartbeat": 5, "lookahead": "0s",
                   "election_timeout_min": "1s", "election_timeout_max": "2s",
                   "append_period": "100ms", "connection_timeout": "2s", "leader_fallback": "1s"}
    d["limits"] = {"idle_timeout": "1h30m", "max_jobs": 10, "history_limit": 5,
                   "done_retention": "7d"}
    d["log"] = {"level": "DEBUG", "format": "text"}
    d["cluster"]["allowed_call_prefixes"] = ["myapp.tasks", "other"]
    d["nodes"][1]["tags"] = ["gpu", "zone:eu-1"]
    cfg = parse_config(d)
    assert cfg.timing == Timing(node_timeout_ms=60_000, heartbeat_ms=5000, lookahead_ms=0,
                                election_timeout_min_ms=1000, election_timeout_max_ms=2000,
                                append_period_ms=100, connection_timeout_ms=2000,
                                leader_fallback_ms=1000)
    assert cfg.limits.idle_timeout_ms == 5_400_000
    assert (cfg.limits.max_jobs, cfg.limits.history_limit) == (10, 5)
    assert cfg.limits.done_retention_ms == 7 * 86_400_000
    assert cfg.log == LogConfig(level="debug", format="text")
    assert cfg.allowed_call_prefixes == ("myapp.tasks", "other")
    assert cfg.nodes[1].tags == ("gpu", "zone:eu-1")


def test_node_lookup_peers_and_data_dir() -> None:
    cfg = parse_config(base())
    assert cfg.node("n2").api == "127.0.0.1:7102"
    assert [p.id for p in cfg.peers_of("n2")] == ["n1", "n3"]
    assert cfg.node_data_dir("n3") == "/var/lib/rs/n3"
    for call in (cfg.node, cfg.peers_of, cfg.node_data_dir):
        with pytest.raises(ConfigError, match=r"config nodes: no node with id 'zz'"):
            call("zz")


def test_same_ports_on_different_hosts_and_wildcard_metrics_are_fine() -> None:
    d = {"cluster": {"data_dir": "d"}, "nodes": [public(1), public(2), public(3)]}
    for n in d["nodes"]:
        n["metrics"] = "0.0.0.0:7201"  # every machine exposes metrics on all interfaces
    assert len(parse_config(d).nodes) == 3


def test_ipv6_and_hostnames() -> None:
    d = base()
    d["nodes"][0].update(raft="[::1]:7001", api="localhost:7101", metrics="node-1.example.com:9")
    cfg = parse_config(d)
    assert cfg.nodes[0].raft == "[::1]:7001"
    assert split_addr("[::1]:7001", "k") == ("::1", 7001)
    assert split_addr("db-2.internal:65535", "k") == ("db-2.internal", 65535)
    assert split_addr("10.1.2.3:1", "k") == ("10.1.2.3", 1)


@pytest.mark.parametrize("host,expected", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LocalHost", True), ("10.0.0.1", False), ("0.0.0.0", False),
    ("::", False), ("example.com", False), ("192.168.1.5", False), ("[2001:db8::1]", False),
])
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


# -------------------------------------------------------------- bad configs

BAD: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    # missing required keys
    ("missing data_dir", without("cluster.data_dir"), "cluster.data_dir"),
    ("missing cluster table", without("cluster"), "cluster.data_dir"),
    ("missing nodes", without("nodes"), "nodes"),
    ("missing node id", without("nodes.1.id"), "nodes[1].id"),
    ("missing node raft", without("nodes.2.raft"), "nodes[2].raft"),
    ("missing node api", without("nodes.0.api"), "nodes[0].api"),
    # unknown keys
    ("unknown root key", with_("bogus", 1), "bogus"),
    ("unknown cluster key", with_("cluster.bogus", 1), "cluster.bogus"),
    ("unknown node key", with_("nodes.1.wrkers", 4), "nodes[1].wrkers"),
    ("unknown limits key", with_("limits.max_jobz", 4), "limits.max_jobz"),
    ("unknown timing key", with_("timing.fsync", False), "timing.fsync"),
    ("unknown log key", with_("log.colour", "red"), "log.colour"),
    # wrong types
    ("bool workers", with_("nodes.0.workers", True), "nodes[0].workers"),
    ("str workers", with_("nodes.0.workers", "4"), "nodes[0].workers"),
    ("float queue", with_("nodes.0.queue", 1.5), "nodes[0].queue"),
    ("bool max_jobs", with_("limits.max_jobs", False), "limits.max_jobs"),
    ("int data_dir", with_("cluster.data_dir", 3), "cluster.data_dir"),
    ("int id", with_("nodes.0.id", 1), "nodes[0].id"),
    ("list raft", with_("nodes.0.raft", ["a"]), "nodes[0].raft"),
    ("str tags", with_("nodes.0.tags", "linux"), "nodes[0].tags"),
    ("int tag", with_("nodes.0.tags", ["ok", 3]), "nodes[0].tags[1]"),
    ("bool duration", with_("timing.heartbeat", True), "timing.heartbeat"),
    ("float duration", with_("timing.heartbeat", 0.5), "timing.heartbeat"),
    ("nodes not array", with_("nodes", {"id": "x"}), "nodes"),
    ("node not table", with_("nodes.1", "n2"), "nodes[1]"),
    ("limits not table", with_("limits", 5), "limits"),
    ("log level", with_("log.level", "verbose"), "log.level"),
    ("log format", with_("log.format", "xml"), "log.format"),
    ("prefixes not list", with_("cluster.allowed_call_prefixes", "pkg"),
     "cluster.allowed_call_prefixes"),
    ("bad prefix", with_("cluster.allowed_call_prefixes", ["ok.mod", "bad-mod"]),
     "cluster.allowed_call_prefixes[1]"),
    ("bad secret_env", with_("cluster.secret_env", "lower_case"), "cluster.secret_env"),
    ("empty data_dir", with_("cluster.data_dir", ""), "cluster.data_dir"),
    # out of range
    ("zero workers", with_("nodes.0.workers", 0), "nodes[0].workers"),
    ("too many workers", with_("nodes.0.workers", 1025), "nodes[0].workers"),
    ("negative queue", with_("nodes.0.queue", -1), "nodes[0].queue"),
    ("huge queue", with_("nodes.0.queue", 100_001), "nodes[0].queue"),
    ("zero max_jobs", with_("limits.max_jobs", 0), "limits.max_jobs"),
    ("too many tags", with_("nodes.0.tags", [f"t{i}" for i in range(33)]), "nodes[0].tags"),
    ("bad tag", with_("nodes.0.tags", ["has space"]), "nodes[0].tags[0]"),
    ("duplicate tag", with_("nodes.0.tags", ["a", "a"]), "nodes[0].tags[1]"),
    ("bad id", with_("nodes.0.id", "n 1"), "nodes[0].id"),
    ("dotdot id", with_("nodes.0.id", ".."), "nodes[0].id"),
    ("long id", with_("nodes.0.id", "x" * 65), "nodes[0].id"),
    ("no nodes", with_("nodes", []), "nodes"),
    ("ten nodes", with_("nodes", [public(i) for i in range(10)]), "nodes"),
    ("spec over frame", with_("limits.max_spec_bytes", 2 * 1024 * 1024), "limits.max_spec_bytes"),
    ("idle_timeout too short", with_("limits.idle_timeout", "10ms"), "limits.idle_timeout"),
    ("bad duration", with_("limits.idle_timeout", "5 minutes"), "limits.idle_timeout"),
    # bad addresses
    ("no port", with_("nodes.0.raft", "127.0.0.1"), "nodes[0].raft"),
    ("port 0", with_("nodes.0.api", "127.0.0.1:0"), "nodes[0].api"),
    ("port too big", with_("nodes.0.api", "127.0.0.1:65536"), "nodes[0].api"),
    ("port not number", with_("nodes.0.api", "127.0.0.1:http"), "nodes[0].api"),
    ("empty host", with_("nodes.1.metrics", ":7201"), "nodes[1].metrics"),
    ("bad ipv4", with_("nodes.0.raft", "300.1.1.1:7001"), "nodes[0].raft"),
    ("short ipv4", with_("nodes.0.raft", "10.0.1:7001"), "nodes[0].raft"),
    ("bad hostname", with_("nodes.0.raft", "bad_host!:7001"), "nodes[0].raft"),
    ("bare ipv6", with_("nodes.0.raft", "::1:7001"), "nodes[0].raft"),
    ("bad ipv6", with_("nodes.0.raft", "[::g]:7001"), "nodes[0].raft"),
    ("ipv6 no port", with_("nodes.0.raft", "[::1]"), "nodes[0].raft"),
    ("wildcard raft", with_("nodes.0.raft", "0.0.0.0:7001"), "nodes[0].raft"),
    # duplicates
    ("duplicate id", with_("nodes.2.id", "n1"), "nodes[2].id"),
    ("duplicate raft", with_("nodes.1.raft", "127.0.0.1:7001"), "nodes[1].raft"),
    ("raft = other api", with_("nodes.2.raft", "127.0.0.1:7101"), "nodes[2].raft"),
    ("same node api = raft", with_("nodes.0.api", "127.0.0.1:7001"), "nodes[0].api"),
    ("duplicate metrics", with_("nodes.2.metrics", "127.0.0.1:7201"), "nodes[2].metrics"),
    ("localhost = 127.0.0.1", with_("nodes.1.api", "localhost:7101"), "nodes[1].api"),
    ("wildcard clashes in node", with_("nodes.0.metrics", "0.0.0.0:7101"), "nodes[0].metrics"),
    # timing
    ("node_timeout < 1s", with_("timing.node_timeout", "999ms"), "timing.node_timeout"),
    ("heartbeat = half", with_("timing.heartbeat", "1500ms"), "timing.heartbeat"),
    ("heartbeat vs short timeout", with_("timing.node_timeout", "1s"), "timing.heartbeat"),
    ("election min = max", with_("timing.election_timeout_min", "600ms"),
     "timing.election_timeout_max"),
    ("election min > max", with_("timing.election_timeout_max", "150ms"),
     "timing.election_timeout_max"),
    ("append too slow", with_("timing.append_period", "67ms"), "timing.append_period"),
    ("connection too short", with_("timing.connection_timeout", "599ms"),
     "timing.connection_timeout"),
    ("fallback too short", with_("timing.leader_fallback", "149ms"), "timing.leader_fallback"),
    ("negative lookahead", with_("timing.lookahead", "-1s"), "timing.lookahead"),
]


@pytest.mark.parametrize("mutate,key", [pytest.param(m, k, id=n) for n, m, k in BAD])
def test_bad_config_names_the_key(mutate: Callable[[dict[str, Any]], None], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mutated(mutate)
    assert info.value.key == key
    assert str(info.value).startswith(f"config {key}: ")
    assert isinstance(info.value, ValueError)


def test_unknown_key_suggests_the_right_one() -> None:
    want = r"nodes\[1\]\.wrkers: unknown key \(did you mean 'workers'\?\)"
    with pytest.raises(ConfigError, match=want):
        parse_mutated(with_("nodes.1.wrkers", 4))


def test_duplicate_names_the_other_key() -> None:
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.raft"):
        parse_mutated(with_("nodes.1.raft", "127.0.0.1:7001"))


def test_parse_does_not_mutate_its_input() -> None:
    d = base()
    before = copy.deepcopy(d)
    parse_config(d)
    assert d == before


def test_non_dict_root() -> None:
    with pytest.raises(ConfigError):
        parse_config([])  # type: ignore[arg-type]


# -------------------------------------------------------------- files


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "file" and str(path) in str(info.value)


def test_toml_syntax_error_has_path_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[cluster]\ndata_dir = "d"\nsecret_env = \n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "file"
    assert str(path) in str(info.value) and "line 3" in str(info.value)


def test_file_with_semantic_error_names_key(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(EXAMPLE.read_text().replace("workers = 4", "wrkers = 4", 1))
    with pytest.raises(ConfigError, match=r"config nodes\[0\]\.wrkers: unknown key"):
        load_config(path)


# -------------------------------------------------------------- secret and binding


def public_cfg(secret_env: str | None = "RS_SECRET") -> ClusterConfig:
    return parse_config({"cluster": {"data_dir": "d", "secret_env": secret_env or ""},
                         "nodes": [public(1), public(2), public(3)]})


def test_resolve_secret() -> None:
    cfg = parse_config(base())
    assert resolve_secret(cfg, {"RS_SECRET": SECRET}) == SECRET
    assert resolve_secret(cfg, {}) is None
    assert resolve_secret(cfg, {"RS_SECRET": ""}) is None
    assert resolve_secret(cfg, {"RAFTSCHED_SECRET": SECRET}) is None  # a different variable
    none_cfg = public_cfg(None)
    assert none_cfg.secret_env is None
    assert resolve_secret(none_cfg, {"RS_SECRET": SECRET}) is None
    d = base()
    d["cluster"]["secret_env"] = None  # a dict (not TOML) may say "no secret" with None
    assert parse_config(d).secret_env is None


def test_short_secret_is_refused_without_echoing_it() -> None:
    short = "Q" * (MIN_SECRET_LEN - 1)
    with pytest.raises(ConfigError) as info:
        resolve_secret(parse_config(base()), {"RS_SECRET": short})
    assert info.value.key == "cluster.secret_env"
    assert "too short" in str(info.value) and "RS_SECRET" in str(info.value)
    assert short not in str(info.value)
    assert resolve_secret(parse_config(base()), {"RS_SECRET": "Q" * MIN_SECRET_LEN})


def test_bind_safety_refuses_public_address_without_secret() -> None:
    cfg = public_cfg()
    with pytest.raises(ConfigError) as info:
        check_bind_safety(cfg, "p2", None)
    msg = str(info.value)
    assert info.value.key == "nodes[1].raft"
    assert "refusing to bind a non-loopback address without a cluster secret" in msg
    assert "RS_SECRET" in msg
    check_bind_safety(cfg, "p2", SECRET)  # with a secret it is fine


def test_bind_safety_names_the_first_public_role() -> None:
    d = base()
    d["nodes"][2]["metrics"] = "0.0.0.0:7203"
    cfg = parse_config(d)
    check_bind_safety(cfg, "n1", None)
    with pytest.raises(ConfigError) as info:
        check_bind_safety(cfg, "n3", None)
    assert info.value.key == "nodes[2].metrics"


def test_bind_safety_without_secret_env_says_to_configure_one() -> None:
    with pytest.raises(ConfigError, match="cluster.secret_env"):
        check_bind_safety(public_cfg(None), "p1", None)


def test_bind_safety_unknown_node() -> None:
    with pytest.raises(ConfigError, match="no node with id"):
        check_bind_safety(public_cfg(), "ghost", None)


def test_secret_never_in_config_or_messages() -> None:
    env = {"RS_SECRET": SECRET}
    cfg = public_cfg()
    secret = resolve_secret(cfg, env)
    assert SECRET not in repr(cfg)
    messages = []
    for mutate in [m for _, m, _ in BAD]:
        with pytest.raises(ConfigError) as info:
            parse_mutated(mutate)
        messages.append(str(info.value))
    for call in (lambda: check_bind_safety(public_cfg(None), "p1", None),
                 lambda: check_bind_safety(cfg, "p1", SECRET[:8]),
                 lambda: check_bind_safety(cfg, "ghost", secret),
                 lambda: resolve_secret(cfg, {"RS_SECRET": SECRET[:8]})):
        with pytest.raises(ConfigError) as info:
            call()
        messages.append(str(info.value))
    assert messages and not any(SECRET in m or SECRET[:8] in m for m in messages)


@settings(max_examples=examples(50), deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1,
               max_size=MIN_SECRET_LEN - 1))
def test_no_short_secret_leaks(short: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_secret(parse_config(base()), {"RS_SECRET": short})
    # The message is fixed text: it cannot contain the secret unless the secret is
    # a piece of that text, so compare against a run with a different secret.
    with pytest.raises(ConfigError) as other:
        resolve_secret(parse_config(base()), {"RS_SECRET": "x"})
    assert str(info.value) == str(other.value)


@settings(max_examples=examples(100), deadline=None)
@given(st.sampled_from(["127.0.0.1", "10.2.3.4", "localhost", "node-7.example.org", "[::1]",
                        "[2001:db8::5]"]),
       st.integers(min_value=1, max_value=65535))
def test_split_addr_round_trip(host: str, port: int) -> None:
    h, p = split_addr(f"{host}:{port}", "k")
    assert (h, p) == (host.strip("[]"), port)


def test_the_address_book_answers_both_ways_and_learns_in_place() -> None:
    from raftsched.node.config.addressbook import AddressBook

    book = AddressBook.of([("n1", "h1:7001"), ("n2", "h2:7001")])
    shared = book  # every part holds the same object
    assert book.node_of("h2:7001") == "n2" and book.raft_of("n1") == "h1:7001"
    assert book.node_of(None) is None and book.raft_of("n9") is None
    book.update({"h9:7001": "n9"})  # the membership refresh names a replicated member
    assert shared.raft_of("n9") == "h9:7001"

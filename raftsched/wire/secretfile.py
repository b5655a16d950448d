"""The cluster secret when none is configured: generated once, found by local clients.

A node never listens unauthenticated (pysyncobj unpickles whatever reaches its Raft
port). Without a configured secret it generates one at first boot into
``<cluster data_dir>/secret`` (mode 0600; the nodes of a loopback cluster share the
data dir, so they share it) and reuses it on later boots. So that a CLI or ``Client``
of the same user on the same host finds it without configuration, the node leaves a
pointer to that file under the user's runtime directory, named after its API address;
the pointer holds a path, never the secret.

The cluster id is derived from the secret (an HMAC, so it reveals nothing usable): it
is the same on every member, stable across restarts, new when a new secret is made,
and lets a client tell which cluster a node belongs to before it authenticates.

A secret file holds one secret per line (blank lines and ``#`` comments aside): the
first is the one used, the others are also accepted — the rollover window of a
rotation (docs/security.md, "Rotating the secret"). Clients use the first.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Mapping

from raftsched.core.errors import ConfigError
from raftsched.wire.session import cluster_id

SECRET_FILE = "secret"
#: Overrides where the address pointers live (tests, several users' sandboxes).
RUNTIME_DIR_ENV = "RAFTSCHED_RUNTIME_DIR"
#: A file holding the secret, for clients (``raftsched local`` prints it).
SECRET_FILE_ENV = "RAFTSCHED_SECRET_FILE"
_MIN_LEN = 16
#: A rotation needs two; a few more is a mistake worth hearing about.
MAX_SECRETS = 4

__all__ = ["cluster_id", "read_secret_file", "read_secrets", "load_or_create_secret"]


def read_secret_file(path: str) -> str:
    """The first (used) secret in ``path``; see :func:`read_secrets`."""
    return read_secrets(path)[0]


def read_secrets(path: str) -> list[str]:
    """The secrets in ``path``, first the used one; ConfigError if the file is not ours,
    readable by others, empty, or holds a short secret."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError("secret_file", f"{path}: cannot read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
            raise ConfigError("secret_file", f"{path}: must be a regular file owned by this "
                                             f"user with mode 0600 (chmod 600 {path})")
        text = f.read(8192).decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.splitlines()]
    found = [ln for ln in lines if ln and not ln.startswith("#")]
    if not found:
        raise ConfigError("secret_file", f"{path}: holds no secret")
    if len(found) > MAX_SECRETS:
        raise ConfigError("secret_file", f"{path}: holds {len(found)} secrets; at most "
                                         f"{MAX_SECRETS} (the used one first)")
    for i, secret in enumerate(found):
        if len(secret) < _MIN_LEN:
            raise ConfigError("secret_file", f"{path}: secret {i + 1} is too short "
                                             f"(need {_MIN_LEN}+ chars)")
    return found


def load_or_create_secret(data_dir: str) -> tuple[str, str]:
    """(secret, path): the one in ``data_dir/secret``, made now if there is none. Nodes
    starting together race safely: the file appears whole (a link) or not at all."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, SECRET_FILE)
    if not os.path.lexists(path):
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_hex(24) + "\n")
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # another node made it first
                os.link(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return read_secret_file(path), os.path.abspath(path)


def runtime_dir(environ: Mapping[str, str] | None = None) -> str:
    """Where this user's address pointers live (not created here)."""
    env = os.environ if environ is None else environ
    if env.get(RUNTIME_DIR_ENV):
        return env[RUNTIME_DIR_ENV]
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "raftsched")
    return os.path.join(os.path.expanduser("~"), ".cache", "raftsched", "nodes")


def _pointer_path(addr: str, environ: Mapping[str, str] | None) -> str:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]").lower()
    if host in ("localhost", "::1"):
        host = "127.0.0.1"
    safe = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
    return os.path.join(runtime_dir(environ), f"{safe}_{port}")


def _private_dir(path: str) -> bool:
    """Is ``path`` a directory only this user can write (so its pointers are ours)?"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def register(api_addr: str, secret_path: str, environ: Mapping[str, str] | None = None) -> str:
    """Leave a pointer from ``api_addr`` to the secret file; returns its path. OSError
    if the runtime dir cannot be made private."""
    path = _pointer_path(api_addr, environ)
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if not _private_dir(folder):
        raise PermissionError(f"{folder} is not a private directory of this user")
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(os.path.abspath(secret_path) + "\n")
    os.replace(tmp, path)
    return path


def unregister(pointer: str, secret_path: str) -> None:
    """Remove the pointer if it still points at our secret file (another node may have
    taken the address since)."""
    with contextlib.suppress(OSError):
        with open(pointer, encoding="utf-8") as f:
            if f.read().strip() != os.path.abspath(secret_path):
                return
        os.unlink(pointer)


def candidate_secrets(addr: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """Secrets a client without one may try on ``addr``: ``$RAFTSCHED_SECRET_FILE``, then
    the file the node at ``addr`` registered. Unreadable candidates are skipped."""
    env = os.environ if environ is None else environ
    paths = []
    if env.get(SECRET_FILE_ENV):
        paths.append(env[SECRET_FILE_ENV])
    pointer = _pointer_path(addr, environ)
    if _private_dir(os.path.dirname(pointer)):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            with open(pointer, encoding="utf-8") as f:
                paths.append(f.read(4096).strip())
    out = []
    for path in paths:
        with contextlib.suppress(ConfigError):
            out.append(read_secret_file(path))
    return out

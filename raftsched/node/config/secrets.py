"""Where a node's secrets come from, and their rotation while it runs.

In order: ``$secret_env`` (one secret; a process's environment cannot change, so it
cannot rotate), else ``cluster.secret_file``, else the file generated at first boot in
``data_dir/secret``. A file holds the used secret first, then the ones still accepted
(:mod:`raftsched.wire.secretfile`); the node re-reads it when it changes and hands the
new keyring to Raft and the API (:meth:`SecretSource.watch`). A file seen changing is
applied once it has stayed the same for one more poll, so a half-written file is never
used; a file that became unreadable or invalid is logged and the old keyring kept.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping

from raftsched.core import ticks
from raftsched.core.errors import ConfigError
from raftsched.node.config.config import ClusterConfig, resolve_secret
from raftsched.wire import session
from raftsched.wire.secretfile import load_or_create_secret, read_secrets

log = logging.getLogger("raftsched.node")

#: How often a secret file is checked for a change.
POLL_S = 1.0


class SecretSource:
    """The node's keyring and where it came from.

    :ivar current: the secrets, the used one first.
    :ivar configured: the used secret if the operator configured one (variable or
        secret_file), else None (a generated secret: loopback only).
    :ivar generated_path: the generated file, when that is the source.
    :ivar path: the file re-read on change, or None (the variable).
    """

    def __init__(self, cfg: ClusterConfig, environ: Mapping[str, str],
                 check: Callable[[str | None], None] = lambda _s: None) -> None:
        """``check(configured)`` runs before a secret is generated (the bind check:
        a refused node must leave nothing behind)."""
        env_secret = resolve_secret(cfg, environ)
        self.generated_path: str | None = None
        self.path: str | None = None
        self.configured: str | None = None
        if env_secret is not None:
            self.current: list[str] = [env_secret]
            self.configured = env_secret
        elif cfg.secret_file is not None:
            self.path = cfg.secret_file
            self.current = read_secrets(cfg.secret_file)
            self.configured = self.current[0]
        if self.configured is not None:
            check(self.configured)
        else:
            check(None)
            _, self.generated_path = load_or_create_secret(cfg.data_dir)
            self.path = self.generated_path
            self.current = read_secrets(self.generated_path)
            self.configured = None
        self._seen = self._stamp()

    @property
    def cluster_id(self) -> str:
        """The id of the used secret (what hello and status name)."""
        return session.cluster_id(self.current[0])

    def cluster_ids(self) -> list[str]:
        return [session.cluster_id(s) for s in self.current]

    def keyring(self) -> tuple[session.Credential, ...]:
        return session.keyring(self.current)

    def names(self) -> list[str]:
        """The admin credentials' names (fingerprints), the used one first."""
        return [c.name for c in self.keyring() if c.role == session.ADMIN]

    def _stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def poll(self) -> list[str] | None:
        """The new secrets if the file changed (and then held still for one poll)."""
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return None
        if stamp != getattr(self, "_pending", None):
            self._pending = stamp  # changed: apply it if it is the same next time
            return None
        self._seen = stamp
        try:
            secrets = read_secrets(self.path or "")
        except ConfigError as exc:
            log.error("secret file changed but cannot be used (%s); keeping the previous "
                      "secrets", exc.message)
            return None
        if secrets == self.current:
            return None
        self.current = secrets
        return secrets

    async def watch(self, changed: Callable[[list[str]], None]) -> None:
        """Runs for the node's life when the secrets come from a file."""
        if self.path is None:
            return
        while True:
            # On the node's shared grid of idle timers (core/ticks.py). The stat stays in a
            # thread: a secret file on a hung network mount must not stop the event loop.
            await asyncio.sleep(ticks.coalesced(asyncio.get_running_loop().time(), POLL_S))
            secrets = await asyncio.to_thread(self.poll)
            if secrets is not None:
                # PBKDF2 for Raft's key runs in a thread, not on the loop.
                await asyncio.to_thread(changed, secrets)

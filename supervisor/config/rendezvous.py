"""The rendezvous settings of a multi-node run, validated without importing torch.

torchrun's options map one to one: ``--nnodes MIN:MAX``, ``--node-rank``,
``--rdzv-backend``, ``--rdzv-endpoint``, ``--rdzv-id`` and ``--rdzv-conf
key=value,...``. Values reach torch's ``RendezvousParameters`` as torchrun
passes them; we check them first so a typo is an error that names the key
instead of a default silently used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from supervisor.config import durations
from supervisor.config.errors import ConfigError

BACKENDS = ("c10d", "static", "etcd-v2")
# torch's older etcd backend (torchrun --rdzv-backend etcd) runs as etcd-v2, on the same
# etcd server: its --rdzv-conf keys under etcd-v2's names (None: no equivalent, dropped)
ETCD_KEYS: dict[str, str | None] = {
    "cert": "ssl_cert",
    "key": "ssl_cert_key",
    "cacert": "ca_cert",
    "timeout": "join_timeout",
    "etcd_prefix": None,
}

# torch's defaults (dynamic_rendezvous.RendezvousTimeout and create_handler)
INT_KEYS: dict[str, int | None] = {
    "join_timeout": 600,
    "last_call_timeout": 30,
    "close_timeout": 30,
    "heartbeat_timeout": 5,
    "keep_alive_interval": 5,
    "keep_alive_max_attempt": 3,
    "read_timeout": 60,
    "timeout": None,  # the static backend's store timeout
}
BOOL_KEYS = ("is_host",)
STR_KEYS = ("store_type", "protocol", "ssl_cert", "ssl_cert_key", "ca_cert")
_TRUE, _FALSE = ("1", "true", "t", "yes", "y"), ("0", "false", "f", "no", "n")


def parse_conf(value: str, backend: str = "c10d") -> dict[str, str]:
    """``--rdzv-conf join_timeout=60,is_host=1``: every key known, every value well formed.
    For ``backend`` etcd, its own keys are read under etcd-v2's names."""
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, sep, raw = (s.strip() for s in item.partition("="))
        if not key or not sep or not raw:
            raise ConfigError(f"--rdzv-conf {value!r}: {item!r} is not key=value")
        if backend == "etcd" and key in ETCD_KEYS:
            renamed = ETCD_KEYS[key]
            if renamed is None:
                continue
            key = renamed
        if key == "keep_alive_max_attempt":  # a count, the one key that is not seconds
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigError(f"--rdzv-conf {key}={raw}: expected a whole number >= 1")
        elif key in INT_KEYS:  # torch reads whole seconds: 10m is written 600 for it
            raw = str(durations.whole_seconds(f"--rdzv-conf {key}", raw, least=1))
        elif key in BOOL_KEYS:
            if raw.lower() not in _TRUE + _FALSE:
                raise ConfigError(f"--rdzv-conf {key}={raw}: expected true or false")
        elif key not in STR_KEYS:
            known = ", ".join(sorted([*INT_KEYS, *BOOL_KEYS, *STR_KEYS]))
            raise ConfigError(f"--rdzv-conf: unknown key {key!r} (known: {known})")
        conf[key] = raw
    return conf


@dataclass(frozen=True, slots=True)
class RdzvConfig:
    backend: str
    endpoint: str
    run_id: str
    min_nodes: int
    max_nodes: int
    node_rank: int = 0  # used by the static backend only: dynamic ones assign it
    local_addr: str | None = None
    conf: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            accepted = ", ".join((*BACKENDS, "etcd"))  # etcd arrives here as etcd-v2
            raise ConfigError(f"--rdzv-backend {self.backend!r}: expected one of {accepted}")
        if not 0 < self.min_nodes <= self.max_nodes:
            raise ConfigError(f"--nnodes {self.min_nodes}:{self.max_nodes}: need 0 < MIN <= MAX")
        if not self.endpoint:
            what = (
                "--master-addr and --master-port" if self.backend == "static" else "--rdzv-endpoint HOST:PORT"
            )
            raise ConfigError(f"--rdzv-backend {self.backend} on several nodes needs {what}")
        if self.backend == "static":
            if self.min_nodes != self.max_nodes:
                raise ConfigError(
                    f"--nnodes {self.min_nodes}:{self.max_nodes}: the static backend needs a fixed "
                    "number of nodes; use --rdzv-backend c10d for MIN:MAX"
                )
            if not 0 <= self.node_rank < self.max_nodes:
                raise ConfigError(f"--node-rank {self.node_rank}: must be in [0, {self.max_nodes})")

    def seconds(self, key: str) -> int:
        raw = self.conf.get(key)
        if raw is not None:
            return int(raw)
        default = INT_KEYS[key]
        if default is None:
            raise KeyError(key)
        return default

    @property
    def keep_alive_bound(self) -> float:
        """Seconds without a keep-alive after which torch (and we) call a node dead."""
        return float(self.seconds("keep_alive_interval") * self.seconds("keep_alive_max_attempt"))

    @property
    def keep_alive_deadline(self) -> int:
        """Seconds a keep-alive may take to land (torch's ``heartbeat_timeout``): as given,
        else half the keep-alive interval, at least torch's 5 s. Every keep-alive rewrites the
        one shared state by compare-and-set; with hundreds of nodes, writers that lose retry,
        and torch's fixed 5 s failed them at rest, while a node is called dead only after
        ``keep_alive_bound`` seconds."""
        given = self.conf.get("heartbeat_timeout")
        if given is not None:
            return int(given)
        return max(self.seconds("heartbeat_timeout"), self.seconds("keep_alive_interval") // 2)

    @property
    def dynamic(self) -> bool:
        return self.backend != "static"

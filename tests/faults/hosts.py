"""Worker "hosts" for the fault suite: network namespaces linked to this one.

Each :class:`Host` is a network namespace with a veth pair to the root namespace, on a
/30 of its own in 10.77.0.0/16 (the root side ``.1`` of the block, the host ``.2``).
The host reaches nothing else: no default route, and its own loopback. PostgreSQL
stays where it is (loopback in the root namespace); a host reaches it only through a
forwarder (:class:`tests.faults.proxy.FaultProxy`) that listens on the root side of
that host's link, so :meth:`Host.url` rewrites a database URL (several hosts in a
multi-host URL too) to go over the link. Workers run there with
``ip netns exec <ns> unshare --pid --fork --mount-proc`` (:meth:`Host.command`): their
own network and their own PID namespace.

Faults:

- :meth:`Host.link_down` takes the root side of the link down (every packet is lost,
  both ways), :meth:`Host.drop` adds iptables DROP rules inside the namespace; both
  are what a dropped route looks like to TCP (connections hang, nothing resets);
  :meth:`Host.heal` undoes either;
- :meth:`Host.slow` delays every chunk through the host's forwarders.

Setup and teardown are robust: names are unique per run (``tq<run><n>``, with the
run's id in a state file under ``STATE_DIR``), the allocation of address blocks is
serialised by a file lock between concurrent runs, :meth:`HostNet.close` removes
everything (links, namespaces, and with them the namespaces' iptables rules) even
after a partial setup, and a later run removes what a killed run (its pid gone) left.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.faults.proxy import FaultProxy
from tests.helpers import UNSHARE

NETWORK = ipaddress.ip_network("10.77.0.0/16")
STATE_DIR = Path(os.environ.get("TETHER_HOSTS_STATE", "/run/tether-fault-hosts"))
NAME_PREFIX = "tq"  # every namespace and link name starts with it (15 characters at most)


class HostsUnavailable(RuntimeError):
    """This machine cannot make hosts (not root, a tool missing, namespaces refused)."""


def tool(name: str) -> str:
    """Where ``name`` is: on the PATH, else in the sbin directories (which a non-login
    shell's PATH may lack); the bare name if nowhere."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin") or name


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("ip"), *args], check=check, capture_output=True, text=True, timeout=30
    )


def unavailable() -> str | None:
    """Why hosts cannot be made here, or ``None`` if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for name in ("ip", "iptables", "unshare"):
        if shutil.which(tool(name)) is None:
            return f"{name} is not installed"
    probe = f"{NAME_PREFIX}probe{secrets.token_hex(2)}"
    try:
        done = _ip("netns", "add", probe, check=False)
        if done.returncode != 0:
            return f"ip netns add failed: {done.stderr.strip()}"
        rules = subprocess.run(
            [tool("ip"), "netns", "exec", probe, tool("iptables"), "-w", "-S"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if rules.returncode != 0:
            return f"iptables does not work in a namespace: {rules.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    """One network namespace linked to the root namespace by a veth pair."""

    name: str  # the namespace (and the root-side link)
    root_addr: str  # this side of the link
    addr: str  # the host's side
    forwards: dict[tuple[str, int], FaultProxy] = field(default_factory=dict)
    rules: list[list[str]] = field(default_factory=list)
    link_is_down: bool = False

    @property
    def link(self) -> str:
        """The root side of the veth pair."""
        return self.name

    def command(self, cmd: list[str]) -> list[str]:
        """``cmd`` run on this host, in a PID namespace of its own."""
        return [tool("ip"), "netns", "exec", self.name, *UNSHARE, *cmd]

    def run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        """Run a command in this host's network namespace (and wait for it)."""
        return subprocess.run(
            [tool("ip"), "netns", "exec", self.name, *cmd],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def forward(self, host: str, port: int) -> int:
        """The port on :attr:`root_addr` that forwards to ``host:port`` (started once)."""
        key = (host, port)
        if key not in self.forwards:
            proxy = FaultProxy(host, port, listen_host=self.root_addr)
            proxy.start()
            self.forwards[key] = proxy
        return self.forwards[key].port

    def url(self, url: str) -> str:
        """``url`` as seen from this host: every ``host:port`` of it (a multi-host URL
        has several) replaced by this host's forwarder to it."""
        parts = urlsplit(url)
        user, _, hosts = parts.netloc.rpartition("@")
        out = []
        for item in hosts.split(","):
            name, _, port = item.rpartition(":") if ":" in item else (item, "", "")
            out.append(f"{self.root_addr}:{self.forward(name or item, int(port or 5432))}")
        netloc = (user + "@" if user else "") + ",".join(out)
        return urlunsplit(parts._replace(netloc=netloc))

    # -- faults ---------------------------------------------------------------------------

    def link_down(self) -> None:
        """Cut the link: the root side goes down, every packet either way is lost."""
        _ip("link", "set", self.link, "down")
        self.link_is_down = True

    def drop(self) -> None:
        """Drop every packet to and from the root side, by iptables rules in the host."""
        for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
            rule = [chain, flag, self.root_addr, "-j", "DROP"]
            self.run(tool("iptables"), "-w", "-I", *rule)
            self.rules.append(rule)

    def heal(self) -> None:
        """Undo :meth:`link_down` and :meth:`drop`."""
        if self.link_is_down:
            _ip("link", "set", self.link, "up")
            self.link_is_down = False
        while self.rules:
            self.run(tool("iptables"), "-w", "-D", *self.rules.pop())

    def slow(self, seconds: float) -> None:
        """Delay every chunk through this host's forwarders by ``seconds`` (0: none)."""
        for proxy in self.forwards.values():
            proxy.set_latency(seconds)

    def reachable(self, url: str) -> bool:
        """Whether a TCP connection from the host to ``url``'s first host opens now."""
        parts = urlsplit(url)
        target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        probe = f"import socket; socket.create_connection({target!r}, 2)"
        try:
            self.run(sys.executable, "-c", probe)
        except subprocess.SubprocessError:
            return False
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with (STATE_DIR / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove(names: list[str]) -> None:
    """Delete these links and namespaces (whichever exist)."""
    for name in names:
        _ip("link", "del", name, check=False)
    for name in names:
        _ip("netns", "del", name, check=False)


def sweep_stale() -> list[str]:
    """Remove the hosts of runs whose process is gone (killed before its teardown)."""
    removed: list[str] = []
    if not STATE_DIR.is_dir():
        return removed
    for state in STATE_DIR.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(state.read_text())
            if _alive(int(info["pid"])):
                continue
            _remove(list(info["hosts"]))
            removed += info["hosts"]
            state.unlink()
    return removed


def _used_blocks() -> set[ipaddress.IPv4Network]:
    out = _ip("-o", "-4", "addr", "show").stdout
    used = set()
    for addr in re.findall(r"inet (10\.77\.\d+\.\d+)/", out):
        used.add(ipaddress.ip_network(f"{addr}/30", strict=False))
    return used


class HostNet:
    """The hosts of one test run; :meth:`close` (always called) removes them all."""

    def __init__(self) -> None:
        self.run_id = secrets.token_hex(3)
        self.hosts: list[Host] = []
        self.state = STATE_DIR / f"{self.run_id}.json"
        self.closed = False

    def _save(self) -> None:
        self.state.write_text(
            json.dumps({"pid": os.getpid(), "hosts": [h.name for h in self.hosts]})
        )

    def add(self, n: int) -> list[Host]:
        """Make ``n`` more hosts."""
        made = []
        with _locked():
            sweep_stale()
            used = _used_blocks()
            blocks = list(NETWORK.subnets(new_prefix=30))
            start = random.randrange(len(blocks))
            free = (b for b in blocks[start:] + blocks[:start] if b not in used)
            for _ in range(n):
                block = next(free)
                root_addr, addr = (str(a) for a in list(block.hosts())[:2])
                host = Host(f"{NAME_PREFIX}{self.run_id}{len(self.hosts)}", root_addr, addr)
                # Recorded before anything is made: a teardown removes whatever exists.
                self.hosts.append(host)
                self._save()
                peer = "eth0"  # its own namespace: no name to collide with
                _ip("netns", "add", host.name)
                _ip(
                    "link",
                    "add",
                    host.link,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    peer,
                    "netns",
                    host.name,
                )
                _ip("addr", "add", f"{root_addr}/30", "dev", host.link)
                _ip("link", "set", host.link, "up")
                _ip("-n", host.name, "addr", "add", f"{addr}/30", "dev", peer)
                _ip("-n", host.name, "link", "set", peer, "up")
                _ip("-n", host.name, "link", "set", "lo", "up")
                made.append(host)
        return made

    def close(self) -> None:
        """Stop the forwarders and remove every link and namespace of this run."""
        if self.closed:
            return
        self.closed = True
        for host in self.hosts:
            for proxy in host.forwards.values():
                with contextlib.suppress(Exception):
                    proxy.stop()
        with _locked():
            # The root side of a link first: deleting a namespace frees its end (and so
            # the pair) only once the last process in it is gone.
            _remove([h.name for h in self.hosts])
            with contextlib.suppress(OSError):
                self.state.unlink()

    def leftovers(self) -> list[str]:
        """Links or namespaces of this run that still exist (none after :meth:`close`)."""
        names = {h.name for h in self.hosts}
        links = set(re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", "show").stdout, re.M))
        spaces = {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line}
        return sorted(names & (links | spaces))

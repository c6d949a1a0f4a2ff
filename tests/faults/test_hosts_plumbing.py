"""The host plumbing itself (:mod:`tests.faults.hosts`): hosts reach the database only
over their link, the partitions cut it and healing restores it, two runs never share a
name or an address, and nothing is left behind, even by a run that was killed."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.faults import hosts as hostmod
from tests.faults.hosts import HostNet

pytestmark = [pytest.mark.postgres]


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_host_reaches_the_database_only_over_its_link_until_cut(
    hosts: HostNet, pg_admin_url: str
) -> None:
    (host,) = hosts.add(1)
    via = host.url(pg_admin_url)
    assert host.root_addr in via
    assert not host.reachable(pg_admin_url)  # loopback there is the host's own
    assert host.reachable(via)
    host.link_down()
    assert not host.reachable(via)
    host.heal()
    assert host.reachable(via)
    host.drop()
    rules = host.run(hostmod.tool("iptables"), "-w", "-S").stdout
    assert rules.count("-j DROP") == 2, rules
    assert not host.reachable(via)
    host.heal()
    assert "-j DROP" not in host.run(hostmod.tool("iptables"), "-w", "-S").stdout
    assert host.reachable(via)


def test_a_multi_host_url_gets_a_forwarder_per_server(hosts: HostNet) -> None:
    (host,) = hosts.add(1)
    url = host.url("postgresql://u@127.0.0.1:5001,127.0.0.1:5002/db?target_session_attrs=any")
    netloc = url.split("//", 1)[1].split("/", 1)[0]
    user, servers = netloc.split("@")
    assert user == "u"
    assert [s.split(":")[0] for s in servers.split(",")] == [host.root_addr] * 2
    assert {k[1] for k in host.forwards} == {5001, 5002}
    assert url.endswith("/db?target_session_attrs=any")


def test_two_runs_share_no_name_or_address_and_leave_nothing_behind(hosts: HostNet) -> None:
    other = HostNet()
    try:
        mine, theirs = hosts.add(2), other.add(2)
        names = [h.name for h in mine + theirs]
        blocks = [h.root_addr for h in mine + theirs]
        assert len(set(names)) == 4 and len(set(blocks)) == 4
    finally:
        other.close()
    assert other.leftovers() == []
    assert not other.state.exists()


def test_what_a_killed_run_left_is_removed_by_the_next(hosts: HostNet) -> None:
    killed = HostNet()
    killed.add(1)
    # As if its process had been SIGKILLed before its teardown ran.
    killed.state.write_text(json.dumps({"pid": _dead_pid(), "hosts": [killed.hosts[0].name]}))
    for proxy in killed.hosts[0].forwards.values():
        proxy.stop()
    assert killed.leftovers()
    removed = hostmod.sweep_stale()
    assert removed == [killed.hosts[0].name]
    assert killed.leftovers() == []
    assert not killed.state.exists()
    hosts.add(1)  # and the next run works

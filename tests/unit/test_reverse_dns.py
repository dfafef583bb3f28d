"""Which addresses the reverse-DNS check looks up: the forms torch's stores see."""

from __future__ import annotations

import pytest

from supervisor.runtime.services.reverse_dns import SLOW, as_store_peer, node_addresses, verdict


@pytest.mark.parametrize(
    ("address", "seen"),
    [
        ("10.1.2.3", "::ffff:10.1.2.3"),  # a store on [::] sees an IPv4 peer v4-mapped
        ("2001:db8::7", "2001:db8::7"),
        ("127.0.1.1", None),  # Debian's hostname line: no other node connects from it
        ("::1", None),
        ("fe80::1%eth0", None),
        ("169.254.3.4", None),
        ("not-an-address", None),
    ],
)
def test_a_node_address_is_looked_up_as_another_node_s_store_sees_it(address: str, seen: str | None) -> None:
    assert as_store_peer(address) == seen


def test_a_lookup_is_slow_from_a_second_on() -> None:
    assert not verdict("::ffff:10.1.2.3", SLOW - 0.01, "no name")["slow"]
    assert verdict("::ffff:10.1.2.3", SLOW, "no name")["slow"]


def test_a_node_given_its_address_is_looked_up_by_it() -> None:
    """``--local-addr``, as torch's rendezvous advertises it (numeric: no resolver asked)."""
    assert node_addresses("10.1.2.3") == ["::ffff:10.1.2.3"]
    assert node_addresses("127.0.0.1") == []  # nobody else connects from there

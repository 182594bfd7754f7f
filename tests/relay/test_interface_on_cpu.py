"""laminar.relay.interface: a relay binds the address of the NIC the user names, or the address given."""

import pytest

from verl_laminar.relay.interface import InterfaceError, interface_address
from verl_laminar.relay.relay import Relay


def test_named_interface_resolves_to_its_address():
    assert interface_address("lo") == "127.0.0.1"


def test_an_address_is_taken_as_it_is():
    assert interface_address("10.1.2.3") == "10.1.2.3"


def test_unknown_interface_names_the_ones_there_are():
    with pytest.raises(InterfaceError, match=r"no such network interface.*'lo'"):
        interface_address("ib-missing0")


def test_relay_binds_the_named_interface_instead_of_its_host(tmp_path):
    r = Relay("nic", root=str(tmp_path / "nic"), host="0.0.0.0", interface="lo")
    try:
        assert r.address()[0] == "127.0.0.1" and r.info()["address"][0] == "127.0.0.1"
    finally:
        r.close(destroy=True)

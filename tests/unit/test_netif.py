"""The choice of the training groups' interface (netif.choose) and what workers are told of it."""

from __future__ import annotations

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.netif import ENV_IFNAME, ROUTE, GroupInterface, choose, interfaces, route_address

pytestmark = pytest.mark.timeout(30)
NODE = {"lo": "127.0.0.1", "mgmt0": "10.77.0.12", "fab0": "10.78.0.12"}


def test_the_interface_on_the_route_to_the_coordinator_by_default() -> None:
    chosen = choose({}, NODE, "10.77.0.12")
    assert chosen == GroupInterface("mgmt0", "10.77.0.12", ROUTE)
    assert chosen.worker_env() == {"GLOO_SOCKET_IFNAME": "mgmt0", "NCCL_SOCKET_IFNAME": "mgmt0"}


def test_a_local_job_uses_loopback() -> None:
    assert choose({}, NODE, "127.0.0.1") == GroupInterface("lo", "127.0.0.1", ROUTE)


def test_slurm_elastic_ifname_wins_over_route_and_torch_variables() -> None:
    env = {ENV_IFNAME: "fab0", "GLOO_SOCKET_IFNAME": "mgmt0"}
    chosen = choose(env, NODE, "10.77.0.12")
    assert chosen == GroupInterface("fab0", "10.78.0.12", ENV_IFNAME)
    assert chosen.worker_env() == {"GLOO_SOCKET_IFNAME": "fab0", "NCCL_SOCKET_IFNAME": "fab0"}


@pytest.mark.parametrize("variable", ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"])
def test_torch_variables_set_by_the_user_are_left_alone(variable: str) -> None:
    chosen = choose({variable: "fab0"}, NODE, "10.77.0.12")
    assert chosen is not None and (chosen.name, chosen.source) == ("fab0", variable)
    assert chosen.address == "10.78.0.12"
    assert chosen.worker_env() == {}


def test_an_unknown_interface_is_one_clear_error() -> None:
    with pytest.raises(ConfigError) as caught:
        choose({ENV_IFNAME: "ib0"}, NODE, "10.77.0.12")
    text = str(caught.value)
    assert "SLURM_ELASTIC_IFNAME='ib0'" in text and "fab0, lo, mgmt0" in text and "\n" not in text


def test_no_route_known_leaves_torch_its_default() -> None:
    assert choose({}, NODE, None) is None
    assert choose({}, NODE, "192.0.2.9") is None  # a route from an address of no interface listed
    assert choose({ENV_IFNAME: "  "}, NODE, None) is None


def test_this_machine_has_loopback_and_routes_to_itself_over_it() -> None:
    found = interfaces()
    assert found.get("lo") == "127.0.0.1"
    assert route_address("127.0.0.1") == "127.0.0.1"

"""Which interface a rank talks on (network.py): pure functions, no cluster."""

from __future__ import annotations

import subprocess

from jupyter_hpcai import network


def test_interface_of_finds_the_interface_holding_an_address() -> None:
    assert network.interface_of("127.0.0.1") == "lo"
    assert network.interface_of("192.0.2.254") is None  # TEST-NET-1: held by no interface here
    # every interface's IPv4 address as iproute2 lists it maps back to that interface (the bridge, eth0, ...)
    listed = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=30,
                            check=True).stdout
    pairs = [(line.split()[1], line.split()[3].split("/")[0]) for line in listed.splitlines()]
    assert pairs
    for iface, address in pairs:
        assert network.interface_of(address) == iface, (iface, address)


def test_rank_network_points_every_transport_at_the_interface() -> None:
    env: dict[str, str] = {}
    network.rank_network(env, "hpc0")
    assert env == {"OMPI_MCA_btl_tcp_if_include": "hpc0", "OMPI_MCA_oob_tcp_if_include": "hpc0",
                   "HOROVOD_GLOO_IFACE": "hpc0", "GLOO_SOCKET_IFNAME": "hpc0", "NCCL_SOCKET_IFNAME": "hpc0"}


def test_rank_network_keeps_what_the_site_or_user_set() -> None:
    env = {"OMPI_MCA_btl_tcp_if_exclude": "docker0", "NCCL_SOCKET_IFNAME": "ib0", "OMPI_MCA_oob_tcp_if_include": "eth1"}
    network.rank_network(env, "hpc0")
    assert "OMPI_MCA_btl_tcp_if_include" not in env  # Open MPI refuses include beside exclude
    assert env["NCCL_SOCKET_IFNAME"] == "ib0" and env["OMPI_MCA_oob_tcp_if_include"] == "eth1"
    assert env["HOROVOD_GLOO_IFACE"] == env["GLOO_SOCKET_IFNAME"] == "hpc0"
    untouched = {"A": "1"}
    network.rank_network(untouched, None)  # no interface found: nothing is guessed
    assert untouched == {"A": "1"}


def test_node_address_comes_from_the_launchers_list() -> None:
    text = network.encode_addresses({"n1": "10.0.0.1", "gpu-02": "10.0.0.2"})
    assert network.decode_addresses(text) == {"n1": "10.0.0.1", "gpu-02": "10.0.0.2"}
    assert network.node_address({network.NODE_ADDRS: text, "SLURMD_NODENAME": "gpu-02"}) == "10.0.0.2"
    assert network.node_address({"SLURMD_NODENAME": "n1"}) == network.LOOPBACK  # outside an engine launch

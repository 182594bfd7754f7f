"""What a relay group checks once its relays are up, before the trainer publishes anything (pure policy; the Ray
calls are in ``trainer/relays.py``).

On a cluster two things break only when the first version arrives, minutes into a run, unless they are checked
here: a node whose ``/dev/shm`` cannot hold the versions its relay keeps (the preflight measures only the node it
runs on), and a relay port that the cluster's firewall blocks (relays listen on an ephemeral port of each node's
address; a dropped connection surfaced as a read timeout after minutes). Each relay reports its store's free bytes,
and each relay opens one connection to its downstream neighbour in the chain (the direction a broadcast goes) with a
bounded wait. Every problem is named with its node, relay, address and port, and the fix.

Not checked: the pulls a replica makes from another node's relay while its own relay is dead (``client.py``), which
go to relays the chain check already reached from their upstream neighbour; with the Mooncake transport, its
one-sided data path (only the relays' TCP control connection is opened here); the room for the delta a relay keeps
with ``laminar.relay.delta=auto`` (optional: a master short of it sends the version whole, as the preflight says).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl_laminar.policy.relay_memory import ROLE_MASTER, ROLE_ROLLOUT, relay_host_bytes

# seconds a relay waits for its neighbour to accept a connection and answer one PING: a loaded node answers in
# well under a second; a firewall that drops the connection never answers
REACH_TIMEOUT_S = 15.0


class RelayAdmissionError(RuntimeError):
    """A relay of the group cannot work: its node's shared memory is short or its neighbour is unreachable."""


@dataclass(frozen=True)
class RelaySite:
    """One started relay as the group sees it."""

    relay_id: str
    node_id: str
    node_ip: str
    address: tuple[str, int]  # where it listens (node address or laminar.relay.interface, ephemeral port)
    store: str  # its store's folder (``/dev/shm/laminar-relay/<id>`` where tmpfs exists)
    store_free: Optional[int]  # bytes free on the store's filesystem at start (None: unknown)
    master: bool


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def needed_bytes(version_bytes: int, keep_versions: int, master: bool) -> int:
    """Shared-memory bytes the relay needs: its kept versions, one more on the master (the spare publish buffer);
    the preflight's ``relay.dev_shm`` rule, applied on the relay's own node."""
    return relay_host_bytes(int(version_bytes), keep_versions, ROLE_MASTER if master else ROLE_ROLLOUT)


def shm_problems(sites: list[RelaySite], version_bytes: Optional[int], keep_versions: int) -> list[str]:
    """One line per relay whose store cannot hold what it keeps; none when the version's size is unknown."""
    if not version_bytes:
        return []
    out = []
    for s in sites:
        need = needed_bytes(version_bytes, keep_versions, s.master)
        if s.store_free is not None and s.store_free < need:
            out.append(f"relay {s.relay_id} on node {s.node_id} ({s.node_ip}): {s.store} has {_gib(s.store_free)} "
                       f"free, its relay keeps up to {_gib(need)} ({keep_versions} versions of {_gib(version_bytes)}"
                       + (", the master's spare publish buffer" if s.master else "") + "). Enlarge /dev/shm on that node (docker "
                       "run --shm-size, Kubernetes emptyDir medium: Memory with sizeLimit) or lower "
                       "laminar.relay.keep_versions")
    return out


def hops(chain: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """(upstream, downstream) for each link of the chain, in broadcast order."""
    return list(zip(chain, chain[1:]))


def hop_problem(src: RelaySite, dst: RelaySite, error: str, timeout_s: float) -> str:
    host, port = dst.address
    if "refused" in error.lower():  # nothing listens there: the relay bound another address, or is gone
        fix = ("nothing accepts connections there: check that the relay binds an address other nodes reach "
               "(laminar.relay.interface) and that its process is alive")
    else:  # dropped or unanswered: a firewall, or no route between the two
        fix = ("relays listen on an ephemeral TCP port of their node's address: allow TCP between the cluster's "
               "nodes on ephemeral ports (net.ipv4.ip_local_port_range), or set laminar.relay.interface to a network "
               "every node reaches")
    return (f"relay {src.relay_id} on node {src.node_id} ({src.node_ip}) cannot reach its downstream relay "
            f"{dst.relay_id} on node {dst.node_id} at {host}:{port} (TCP) within {timeout_s:g} s: {error}. {fix}")


def hop_problems(sites: dict[str, RelaySite], answers: dict[tuple[str, str], Optional[str]],
                 timeout_s: float = REACH_TIMEOUT_S) -> list[str]:
    """One line per chain link whose upstream could not reach its downstream (``answers``: ``Relay.reach``)."""
    return [hop_problem(sites[a], sites[b], err, timeout_s) for (a, b), err in answers.items() if err is not None]


def admission_error(group: str, problems: list[str]) -> RelayAdmissionError:
    return RelayAdmissionError(f"relay group {group}: {len(problems)} problem(s) before the first version:\n- "
                               + "\n- ".join(problems))


__all__ = ["REACH_TIMEOUT_S", "RelayAdmissionError", "RelaySite", "admission_error", "hop_problem", "hop_problems",
           "hops", "needed_bytes", "shm_problems"]

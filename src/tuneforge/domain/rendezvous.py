"""How the ranks of one multi-GPU attempt find each other: torchrun's variables.

A contract between whoever starts the ranks (`executors/ray_host.py` on each
node, `train/distributed.py` on one host) and the trainer that reads them.
"""

from __future__ import annotations

RANK_ENV = "RANK"
WORLD_ENV = "WORLD_SIZE"
LOCAL_RANK_ENV = "LOCAL_RANK"  # the rank's GPU among its node's; default: the rank
LOCAL_WORLD_ENV = "LOCAL_WORLD_SIZE"
ADDR_ENV = "MASTER_ADDR"  # rank 0's address (another node's in a multi-node attempt)
PORT_ENV = "MASTER_PORT"
RENDEZVOUS_ENV = (RANK_ENV, WORLD_ENV, LOCAL_RANK_ENV, LOCAL_WORLD_ENV, ADDR_ENV, PORT_ENV)


def rendezvous_env(rank: int, world: int, local_rank: int, local_world: int, address: str, port: int) -> dict[str, str]:
    """The torchrun variables of one rank."""
    values = (rank, world, local_rank, local_world, address, port)
    return {name: str(value) for name, value in zip(RENDEZVOUS_ENV, values)}

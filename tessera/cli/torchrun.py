"""`torchrun ... -m tessera.cli.torchrun VERB ARGS...`: a tessera verb across hosts. Rank 0 runs VERB
(`serve-run`, `generate`, `serve`) as the driver; every other rank becomes one engine worker, ranks 1..N
taking the entries of `--devices` in order (tessera.engine.remote).

    # driver host (node 0) and a worker host (node 1), two workers there:
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr HOST0 --master-port 29500 \\
        -m tessera.cli.torchrun serve-run llama-tiny --devices cpu,cpu --verify
    torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr HOST0 --master-port 29500 \\
        -m tessera.cli.torchrun serve-run llama-tiny --devices cpu,cpu --verify
"""

from __future__ import annotations

import sys

from tessera.cli import main as cli_main
from tessera.engine.remote import RemoteLink, bootstrap, connect, engine_env, install, worker_loop
from tessera.engine.worker import worker_main
from tessera.errors import UserError


def main(argv: list[str]) -> None:
    try:
        env = engine_env()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    listener, infos = bootstrap(env)
    if env.rank != 0:
        worker_loop(connect(infos, env.rank), worker_main)
        return
    assert listener is not None
    link = RemoteLink.accept(listener, infos)
    install(link)
    try:
        cli_main(argv)
    finally:
        link.close()


if __name__ == "__main__":
    main(sys.argv[1:])

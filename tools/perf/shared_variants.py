"""`radixflow bench` cold with or without engines sharing a loaded model's compiled step variants.

    RADIXFLOW_CACHE=$(mktemp -d) python tools/perf/shared_variants.py --share 1
    RADIXFLOW_CACHE=$(mktemp -d) python tools/perf/shared_variants.py --share 0

Each call runs the default `radixflow bench` (three policies, one engine each, on one loaded
model); `--share 0` sets every loaded model's ``compiled_variants`` to ``None``, so each engine
traces every variant it uses again (the persistent XLA cache still spares it the compile). Give
each call an empty ``RADIXFLOW_CACHE`` and alternate the two settings: the wall time printed last
(stderr) includes writing the preset and every compile.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--share", type=int, choices=(0, 1), default=1)
    args = p.parse_args()
    from radixflow_jax.models import api

    if not args.share:
        init = api.LoadedModel.__init__

        def unshared(self: api.LoadedModel, *a: object, **k: object) -> None:
            init(self, *a, **k)  # type: ignore[arg-type]
            self.compiled_variants = None  # type: ignore[assignment]

        api.LoadedModel.__init__ = unshared  # type: ignore[method-assign]
    from radixflow_jax.cli import main as cli_main

    start = time.perf_counter()
    rc = cli_main(["bench"])
    print(f"share={args.share}: radixflow bench took {time.perf_counter() - start:.1f} s (rc {rc}, "
          f"load {'/'.join(f'{x:.1f}' for x in os.getloadavg())})", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()

"""Writing `route_trace v1` files: one row per routed expert (DESIGN 6.4).

```
# route_trace v1
# model=NAME arch=ARCH n_layer=N n_expert=E n_expert_used=K
# layer=L expert_bytes=B dense_bytes=D        (one line per layer)
turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped
```

phase 0 is prefill, 1 decode; `step` counts forward passes within a phase from 0;
residency 0 miss, 1 hit, 2 hit on an expert a speculative read brought in (its first hit);
a dropped expert is recorded with residency 0 and `dropped=1` (it was not read). The file
is written beside its destination and renamed into place when the run ends, so a crash
never leaves half a trace.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TextIO

HEADER = "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped"


class RouteTraceWriter:
    def __init__(self, path: str | os.PathLike[str], model: str, arch: str, n_layer: int,
                 n_expert: int, n_expert_used: int,
                 layer_bytes: list[tuple[int, int]]) -> None:
        self.path = Path(path)
        fd, tmp = tempfile.mkstemp(prefix="." + self.path.name + ".", suffix=".tmp",
                                   dir=self.path.parent)
        self._tmp = Path(tmp)
        self._f: TextIO = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        self._f.write("# route_trace v1\n")
        self._f.write(f"# model={model.replace(' ', '_')} arch={arch} n_layer={n_layer} "
                      f"n_expert={n_expert} n_expert_used={n_expert_used}\n")
        for i, (expert_bytes, dense_bytes) in enumerate(layer_bytes):
            self._f.write(f"# layer={i} expert_bytes={expert_bytes} dense_bytes={dense_bytes}\n")
        self._f.write(HEADER + "\n")

    def layer(self, phase: int, step: int, layer: int, experts: list[int],
              weights: list[float], residency: list[int], dropped: list[int],
              expert_bytes: int) -> None:
        self._f.writelines(
            f"0,{phase},{step},{layer},{slot},{e},{w:.6f},{r},{expert_bytes},{dr}\n"
            for slot, (e, w, r, dr) in enumerate(zip(experts, weights, residency, dropped))
        )

    def close(self) -> None:
        """Finish the file and move it into place."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)

    def abandon(self) -> None:
        self._f.close()
        self._tmp.unlink(missing_ok=True)

"""`engine/arch/__init__.py`: every architecture by its name, its code imported only when a
run asks for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from abbench.engine.architectures import TABLE

# In a fresh process: which architecture packages a lookup of `sys.argv[1]` imported.
LOADED = ("import sys; from abbench.engine.arch import ARCHITECTURES, GRAPHS; "
          "name = sys.argv[1]; assert name in ARCHITECTURES and name in GRAPHS; "
          "ARCHITECTURES[name], GRAPHS[name]; "
          "print(' '.join(sorted({m.split('.')[3] for m in sys.modules "
          "if m.startswith('abbench.engine.arch.') and m.count('.') >= 4})))")


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_a_run_imports_only_its_own_architecture(row) -> None:
    p = subprocess.run([sys.executable, "-c", LOADED, row.name], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert set(p.stdout.split()) == {row.package, "shared"}


def test_every_row_is_listed_and_its_modules_load() -> None:
    from abbench.engine.arch import ARCHITECTURES, GRAPHS

    names = [row.name for row in TABLE]
    assert list(ARCHITECTURES) == names and list(GRAPHS) == names and len(GRAPHS) == len(TABLE)
    for name in names:
        assert hasattr(ARCHITECTURES[name], "Model") and hasattr(GRAPHS[name], "GraphModel")
    with pytest.raises(KeyError):
        ARCHITECTURES["llama"]

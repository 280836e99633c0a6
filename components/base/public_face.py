"""A package's public face that loads on first use (PEP 562): ``sublimate.components``,
``sublimate.pipelines`` and the local runner name what users may import, and importing the
package imports none of it until a name is asked for.

Standard library only, and nothing at import time: the package roots import this and nothing
else of their own (``tests/test_architecture.py``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str],
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` for ``exports``: public name
    -> ``"module"`` (the module itself) or ``"module:attribute"``, relative to ``package``. A
    name once loaded becomes a plain attribute of the package."""

    def __getattr__(name: str) -> Any:
        try:
            target = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        module_name, _, attribute = target.partition(":")
        module = importlib.import_module(f"{package}.{module_name}")
        value = getattr(module, attribute) if attribute else module
        setattr(sys.modules[package], name, value)  # from now on a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__

"""lpjax's optional dependencies: imported where they are used, and, when missing, named with the extra that
installs them.

``pip install lpjax`` installs the library's core (jax, flax, optax, orbax). Everything else is an extra of
``setup.cfg``, imported only by the code that needs it, through :func:`require` (or checked without importing
through :func:`check`), so that a missing one fails with one line saying what to install::

    ModuleNotFoundError: dm_control is not installed: pip install 'lpjax[dmc]'

This module imports nothing from lpjax, so every module of lpjax, the leaf modules included, may use it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


def missing(module_name: str, extra: str) -> ModuleNotFoundError:
    """The one-line error for ``module_name`` not being installed: ``"<name> is not installed: pip install
    'lpjax[<extra>]'"``."""
    return ModuleNotFoundError(f"{module_name} is not installed: pip install 'lpjax[{extra}]'", name=module_name)


def _is_missing(error: ModuleNotFoundError, module_name: str) -> bool:
    """Whether ``error`` says that ``module_name`` or one of its parent packages is missing (not something that
    the installed module itself failed to import)."""
    parts = module_name.split(".")
    return error.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _installed(top_level: str) -> bool:
    """Whether the top-level package ``top_level`` can be found, without importing it."""
    try:
        return importlib.util.find_spec(top_level) is not None
    except ValueError:  # in sys.modules without a __spec__
        return True


def require(module_name: str, extra: str) -> ModuleType:
    """Imports ``module_name`` (e.g. ``"dm_control.suite"``) and returns it.

    Raises:
      ModuleNotFoundError: one line naming the extra (see :func:`missing`), if ``module_name`` or a parent
        package of it is not installed; it names the top-level package when that one is missing. Other import
        errors (an installed package that fails to import) are raised unchanged.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if not _is_missing(error, module_name):
            raise
        top = module_name.partition(".")[0]
        raise missing(error.name if _installed(top) else top, extra) from None


def check(module_name: str, extra: str) -> None:
    """Raises :func:`require`'s error if the top-level package of ``module_name`` is not installed, without
    importing it (for code that only checks, or imports it later under its own error handling)."""
    top = module_name.partition(".")[0]
    if not _installed(top):
        raise missing(top, extra)


__all__ = ["check", "missing", "require"]

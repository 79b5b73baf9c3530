"""scikit-learn's regression tree with its parameter names looked up once (imported lazily by
:mod:`analysis.surrogate`, so importing ``analysis`` does not import scikit-learn).

A forest clones its template tree for every tree it fits, and each clone introspects the tree
constructor's signature (``inspect.signature``) twice: about 2 ms per tree, several seconds of a
full analysis that fits about 3,400 trees. The names never change, so :class:`CachedParamsTree`
returns them from a cache; its trees (and so every fit, prediction and interval) are exactly those
of ``DecisionTreeRegressor``.
"""

from __future__ import annotations

from sklearn.tree import DecisionTreeRegressor

_NAMES: list[str] = DecisionTreeRegressor._get_param_names()


class CachedParamsTree(DecisionTreeRegressor):
    """``DecisionTreeRegressor`` whose ``_get_param_names`` is computed once."""

    @classmethod
    def _get_param_names(cls) -> list[str]:
        return list(_NAMES)

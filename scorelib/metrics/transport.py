"""Exact 2-Wasserstein distance between two equal-weight sample sets (optimal transport).

``W2(X, Y)^2 = min_P sum_ij P_ij ||x_i - y_j||^2`` over couplings ``P`` of the uniform
weights (Villani, "Optimal transport", 2009, Def. 6.1), solved exactly by the network
simplex of POT (``ot.emd2``; Bonneel et al., SIGGRAPH Asia 2011), not by Sinkhorn (whose
entropic bias is of the order of the distances compared here). With ``n = m`` the optimal
coupling is a permutation (Birkhoff), so the answer is the linear assignment cost.
"""

from __future__ import annotations

import numpy as np

from scorelib._checks import check_example_sets, require


def exact_w2(x, y) -> float:
    """Exact ``W2`` (data units) between the empirical measures of ``x: [n, *shape]`` and
    ``y: [m, *shape]``, uniform weights.

    Raises:
      ValueError: naming ``x`` or ``y`` (not real ``[n, *shape]``, or another example
        shape than ``x``'s), or for non-finite values.
    """
    check_example_sets(x, y)
    a = np.asarray(x, np.float64).reshape(len(x), -1)
    b = np.asarray(y, np.float64).reshape(len(y), -1)
    require(
        bool(np.all(np.isfinite(a)) and np.all(np.isfinite(b))), "samples", "finite", "NaN or inf"
    )
    # POT takes about 1.5 s to import: paid on first use only
    import ot

    cost = ot.dist(a, b, metric="sqeuclidean")
    w2sq = ot.emd2(
        np.full(len(a), 1 / len(a)), np.full(len(b), 1 / len(b)), cost, numItermax=10_000_000
    )
    return float(np.sqrt(max(w2sq, 0.0)))

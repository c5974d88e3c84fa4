#!/usr/bin/python3
"""Fits the piecewise polynomial table of the AVX-512 GELU pass (src/runtime/kernels/elementwise/gelu_avx512.cpp).

Phi(-a) = erfc(a / sqrt(2)) / 2 for a in [0, 6) is split into 32 intervals of width 6/32; on interval i,
a = (i + t) * 6/32 with t in [0, 1), Phi(-a) ~ c0 + c1 t + ... + c5 t^5 (Chebyshev least squares,
converted to the power basis, rounded to float). Prints the table rows (one per power) and the
worst errors of the float Horner evaluation against math.erfc in double.

  /usr/bin/python3 scripts/fit_gelu_table.py
"""
import math

import numpy as np

INTERVALS, DEGREE, RANGE = 32, 5, 6.0


def phi_minus(a):
    return 0.5 * np.vectorize(math.erfc)(np.asarray(a, dtype=np.float64) / math.sqrt(2.0))


def main():
    width = RANGE / INTERVALS
    nodes = 0.5 + 0.5 * np.cos(np.pi * (np.arange(200) + 0.5) / 200)  # Chebyshev points on [0, 1]
    rows, worst_abs, worst_rel = [], 0.0, 0.0
    for i in range(INTERVALS):
        fit = np.polynomial.chebyshev.Chebyshev.fit(nodes, phi_minus((i + nodes) * width), DEGREE,
                                                    domain=[0, 1])
        c = fit.convert(kind=np.polynomial.Polynomial).coef.astype(np.float32)
        rows.append(c)
        u = np.linspace(0, 1, 4001).astype(np.float32)
        p = np.full_like(u, c[DEGREE])
        for j in range(DEGREE - 1, -1, -1):
            p = (p * u + c[j]).astype(np.float32)
        ref = phi_minus((i + u.astype(np.float64)) * width)
        worst_abs = max(worst_abs, float(np.max(np.abs(p - ref))))
        worst_rel = max(worst_rel, float(np.max(np.abs(p - ref) / ref)))
    for j in range(DEGREE + 1):
        print("    {" + ", ".join("%.9gf" % v for v in np.array(rows)[:, j]) + "},")
    print(f"// worst |error| {worst_abs:.3g}, worst relative error {worst_rel:.3g}")


if __name__ == "__main__":
    main()

"""Density images of dense scatters for plain Bokeh figures (datashader, drawn once on the server).

Above :data:`RASTER_ABOVE` points a scatter costs the browser more than it shows: thousands of
glyphs (and their hover labels) to send, decode and paint. :func:`density` bins every point with
datashader (``Canvas.points`` with a count per bin; nothing is sampled) and shades the counts
(``eq_hist`` over a palette); :func:`add_density` puts the result on a figure as one
``image_rgba`` glyph covering the plotted ranges, so the image is a few tens of kB whatever the
number of points. The image is static: zooming magnifies its bins rather than re-binning (the
Pareto explorer re-rasterises on zoom through HoloViews; these pages draw plain Bokeh).

The frame's layout is datashader's: ``image[0, 0]`` is the bin of the lowest x and lowest y,
which is Bokeh's ``origin="bottom_left"`` default, so the array goes to Bokeh as it is. A log x
axis is binned on log10(x) and the image's extent given in data units: Bokeh stretches an image
between its screen corners, so bins of equal width in log10 space are of equal width on screen.

The points' frame always has the columns ``x`` and ``y`` (float64) and the aggregate is a
count, the layout of the Pareto explorer's cloud (:func:`dashboards.app.pareto.cloud_points`), so
datashader's numba kernels, compiled per column layout, are those the server's warm-up has
already compiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

RASTER_ABOVE = 3_000  # scatters with more points than this are drawn as a density image

#: palettes (light to dark) without their lightest quarter: a bin holding one point stays visible
BLUES = ("#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b")
REDS = ("#fc9272", "#fb6a4a", "#ef3b2c", "#cb181d", "#a50f15", "#67000d")


@dataclass(frozen=True)
class Density:
    """A shaded density image: ``rgba`` (height x width, uint32, row 0 = lowest y), the data
    extent it covers (``x0``, ``x1``, ``y0``, ``y1``; x in data units also on a log axis), the
    count per bin (``counts``, same shape) and whether x was binned on log10."""

    rgba: np.ndarray
    counts: np.ndarray
    x0: float
    x1: float
    y0: float
    y1: float
    log_x: bool


def padded(lo: float, hi: float, frac: float = 0.04, log: bool = False) -> tuple[float, float]:
    """``(lo, hi)`` widened by ``frac`` of the span on each side (a span of 1 around a single
    value; on log10 for a log axis, whose bounds must stay positive)."""
    if log:
        a, b = padded(float(np.log10(lo)), float(np.log10(hi)), frac)
        return float(10 ** a), float(10 ** b)
    if not hi > lo:
        return lo - 0.5, hi + 0.5
    pad = (hi - lo) * frac
    return lo - pad, hi + pad


def density(x: np.ndarray, y: np.ndarray, width: int, height: int, x_range: tuple[float, float],
            y_range: tuple[float, float], palette: tuple[str, ...] = BLUES, log_x: bool = False) -> Density:
    """Every finite point of ``(x, y)`` binned on a ``width`` x ``height`` grid over the ranges
    (on log10(x) when ``log_x``; x <= 0 is then left out), counts shaded with ``eq_hist``."""
    import datashader as dsh
    import datashader.transfer_functions as tf

    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    xr = (float(np.log10(x_range[0])), float(np.log10(x_range[1]))) if log_x else (float(x_range[0]), float(x_range[1]))
    if log_x:
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(x > 0, np.log10(np.where(x > 0, x, 1.0)), np.nan)
    keep = np.isfinite(x) & np.isfinite(y)
    frame = pd.DataFrame({"x": x[keep], "y": y[keep]})
    canvas = dsh.Canvas(plot_width=width, plot_height=height, x_range=xr, y_range=(float(y_range[0]), float(y_range[1])))
    agg = canvas.points(frame, "x", "y", agg=dsh.count())
    counts = np.asarray(agg.data)
    if counts.any():
        rgba = np.asarray(tf.shade(agg, cmap=list(palette), how="eq_hist").data, dtype=np.uint32)
    else:
        rgba = np.zeros(counts.shape, dtype=np.uint32)
    return Density(rgba, counts, float(x_range[0]), float(x_range[1]), float(y_range[0]), float(y_range[1]), log_x)


def add_density(fig: Any, d: Density, name: str, legend_label: str | None = None) -> Any:
    """``d`` on ``fig`` as one ``image_rgba`` glyph (source named ``name``: columns ``image``, ``x``,
    ``y``, ``dw``, ``dh``) that hover and selection pass through; returns the renderer."""
    from bokeh.models import ColumnDataSource

    src = ColumnDataSource({"image": [d.rgba], "x": [d.x0], "y": [d.y0], "dw": [d.x1 - d.x0], "dh": [d.y1 - d.y0]},
                           name=name)
    kw = {"legend_label": legend_label} if legend_label else {}
    return fig.image_rgba(image="image", x="x", y="y", dw="dw", dh="dh", source=src, **kw)

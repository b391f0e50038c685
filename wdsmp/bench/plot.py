"""The loader benchmark as a picture: images/s over time for each contender, and each one's
worker time per image, stacked by stage (``benchmark.Result.series`` and ``.stages``).

matplotlib is an optional extra (``pip install 'wdsmp[plot]'``); :func:`draw` says so when
it is missing, and the benchmark goes on without the picture.
"""

import bisect
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, cast

__all__ = ["draw", "rates"]

_WINDOW_S = 3.0  # the rate at a batch counts the images that came in the seconds before it


def rates(series: Sequence[Tuple[float, int]], window: float = _WINDOW_S) -> Tuple[List[float], List[float]]:
    """``(times, images/s)``: at 0 s and at each batch of ``series`` (``[(seconds since the loader
    was made, images so far)]``), the images that came in the last ``window`` seconds, over
    ``window`` (over the time since 0 s, before ``window`` seconds have passed)."""
    times, values = [0.0], [0.0]
    arrivals = [t for t, _ in series]
    for now, images in series:
        start = max(now - window, 0.0)
        before = bisect.bisect_right(arrivals, start)  # batches that came by ``start``
        earlier = series[before - 1][1] if before else 0
        times.append(now)
        values.append((images - earlier) / (now - start) if now > start else 0.0)
    return times, values


# Each stage keeps its colour from one picture to the next (``benchmark.STAGE_GROUPS``, then "other").
STAGE_ORDER = ("read shards", "decode", "crop, resize, flip", "batch", "other")


def draw(results: Mapping[str, Any], path: str, title: str, note: Optional[str] = None) -> None:
    """Write the picture of ``results`` (``{contender: Result}``, the best rounds) to ``path``,
    with ``note`` under it; ImportError (with what to install) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exn:
        raise ImportError("the picture needs matplotlib: pip install 'wdsmp[plot]'") from exn
    figure, (over_time, by_stage) = plt.subplots(1, 2, figsize=(11, 5.0), gridspec_kw={"width_ratios": [3, 2]})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    measured = {name: result for name, result in results.items() if result.images_per_s is not None}
    for (name, result), colour in zip(measured.items(), colours):
        if result.series:
            times, values = rates(result.series)
            over_time.plot(times, values, label=f"{name} ({result.images_per_s:,.0f}/s)", color=colour)
        else:
            over_time.axhline(result.images_per_s, linestyle="--", label=f"{name} ({result.images_per_s:,.0f}/s)",
                              color=colour)
    over_time.set_xlabel("seconds since the loader was made")
    over_time.set_ylabel("images/s")
    over_time.set_ylim(bottom=0)
    over_time.set_title("images/s over time (best round)")
    # Below the axes: inside, the legend would hide the curves' last seconds.
    over_time.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    names = [name for name, result in measured.items() if result.stages]
    stages = list(dict.fromkeys(stage for name in names for stage in cast(Dict[str, float], results[name].stages)))
    stages.sort(key=lambda stage: STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER))
    palette: Sequence[Tuple[float, float, float]] = plt.get_cmap("Set2").colors  # type: ignore[attr-defined]
    left = [0.0] * len(names)
    for stage in stages:
        colour = palette[(STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER)) % len(palette)]
        widths = [cast(Dict[str, float], results[name].stages).get(stage, 0.0) for name in names]
        by_stage.barh(names, widths, left=left, label=stage, color=colour)
        left = [a + b for a, b in zip(left, widths)]
    by_stage.invert_yaxis()
    by_stage.set_xlabel("worker milliseconds per image (wall clock)")
    by_stage.set_title("where the workers' time goes")
    by_stage.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    figure.suptitle(title, fontsize="medium")
    if note:
        figure.text(0.5, 0.01, note, ha="center", va="bottom", fontsize="small", wrap=True)
    figure.tight_layout(rect=(0, 0.05 if note else 0, 1, 1))
    figure.savefig(path, dpi=80)
    plt.close(figure)

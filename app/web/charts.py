"""Plotly figures of the pages, built server-side from query results and sent as JSON.

Each builder is a pure function of plain data returning a figure's JSON text (``None`` when there is
nothing to draw); ``static/draftscope.js`` hands it to the vendored plotly.js. Figures are plotly
figure dicts serialised by ``plotly.io`` without validation: ``graph_objects`` validates every
property on assignment, 20-40 ms a figure, most of a page's time budget.
"""

from __future__ import annotations

from typing import Any

import plotly.io as pio

GREEN, RED, BLUE, GREY = "#2e7d32", "#c62828", "#1565c0", "#b0b7c3"
SERIES = ("#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#558b2f", "#4e342e", "#37474f")
# Compare: run A in cool colours, solid, filled circles; run B in warm ones, dashed, open diamonds (drawn
# larger, so a B point on top of A's still shows A's inside it). No colour is shared by the two runs.
RUN_COLOURS = ("#1565c0", "#ef6c00")
RUN_SERIES = (("#1565c0", "#00838f", "#6a1b9a", "#2e7d32", "#37474f"),
              ("#ef6c00", "#ad1457", "#8d6e63", "#c0a000", "#d84315"))
RUN_LINES = ({"dash": "solid", "width": 2}, {"dash": "dash", "width": 2})
RUN_MARKERS = ({"symbol": "circle", "size": 6}, {"symbol": "diamond-open", "size": 11, "line": {"width": 2}})


def _layout(x: dict[str, Any], y: dict[str, Any], height: int = 260, **kw: Any) -> dict[str, Any]:
    """A chart's layout: the top margin holds the toolbar (shown on hover) and the legend sits above
    the plot, clear of the x-axis title whatever its number of rows."""
    axis = {"gridcolor": "#eceff1", "zeroline": False, "automargin": True}
    return {"height": height, "margin": {"l": 52, "r": 12, "t": 30, "b": 40},
            "font": {"family": "system-ui, sans-serif", "size": 12},
            "paper_bgcolor": "white", "plot_bgcolor": "white",
            "xaxis": {**axis, **x}, "yaxis": {**axis, **y},
            "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"}, **kw}


def _run_style(i: int, runs: int, colour: str | None = None) -> dict[str, Any]:
    """Line and marker of run ``i``'s series (of ``runs``): one run plain; two told apart by colour,
    dash and marker."""
    colour = colour or (RUN_COLOURS[i % 2] if runs > 1 else BLUE)
    if runs == 1:
        return {"line": {"color": colour}, "marker": {"color": colour, "size": 6}}
    return {"line": {**RUN_LINES[i % 2], "color": colour}, "marker": {**RUN_MARKERS[i % 2], "color": colour}}


def _title(text: str) -> dict[str, Any]:
    return {"text": text}


def _json(data: list[dict[str, Any]], layout: dict[str, Any]) -> str | None:
    return pio.to_json({"data": data, "layout": layout}, validate=False) if data else None


def per_position(runs: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Acceptance rate per draft position, one bar series per (label, summary)."""
    data, notes = [], []
    for i, (label, summary) in enumerate(runs):
        rows = (summary.get("acceptance") or {}).get("per_position") or []
        proposed, accepted = sum(r["proposed"] or 0 for r in rows), sum(r["accepted"] or 0 for r in rows)
        if proposed and not accepted:  # bars of height 0: say so, or the chart reads as empty
            notes.append(f"{label + ': ' if len(runs) > 1 else ''}0 of {proposed:,} drafts accepted")
        if rows:
            data.append({"type": "bar", "name": label, "x": [r["position"] for r in rows],
                         "y": [r["rate"] for r in rows],
                         "marker": {"color": RUN_COLOURS[i % 2] if len(runs) > 1 else BLUE},
                         "customdata": [[r["accepted"], r["proposed"]] for r in rows],
                         "hovertemplate": "position %{x}: %{y:.1%} (%{customdata[0]} of "
                                          "%{customdata[1]})<extra>" + label + "</extra>"})
    annotations = [{"text": "<br>".join(notes), "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                    "showarrow": False, "font": {"size": 13, "color": "#3b4654"}}] if notes else []
    return _json(data, _layout({"title": _title("draft position"), "dtick": 1},
                               {"title": _title("accepted"), "tickformat": ".0%", "range": [0, 1]},
                               barmode="group", showlegend=len(runs) > 1, annotations=annotations))


def accept_over_time(runs: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Traced accept length per time bin, seconds from each run's first bin."""
    data = []
    for i, (label, summary) in enumerate(runs):
        bins = [b for b in summary.get("over_time") or [] if b.get("steps")]
        if bins:
            t0 = bins[0]["t0"]
            data.append({"type": "scatter", "mode": "lines+markers", "name": label,
                         "x": [round(b["t0"] - t0, 3) for b in bins],
                         "y": [b["accept_length"] for b in bins], **_run_style(i, len(runs)),
                         "customdata": [b["steps"] for b in bins],
                         "hovertemplate": "%{x:.1f} s: %{y:.2f} over %{customdata} steps<extra>"
                                          + label + "</extra>"})
    return _json(data, _layout({"title": _title("seconds since the first sampled step")},
                               {"title": _title("accept length"), "rangemode": "tozero"},
                               showlegend=len(runs) > 1))


def accept_by_seq_pos(runs: list[tuple[str, dict[str, Any]]],
                      max_positions: int | None = None) -> str | None:
    """Traced accept length against the sequence position of the verify step; a dashed line at the
    draft's max_position_embeddings when given."""
    data = []
    for i, (label, summary) in enumerate(runs):
        bins = [b for b in summary.get("by_seq_pos") or [] if b.get("steps")]
        if bins:
            data.append({"type": "scatter", "mode": "lines+markers", "name": label,
                         "x": [(b["lo"] + b["hi"]) / 2 for b in bins],
                         "y": [b["accept_length"] for b in bins], **_run_style(i, len(runs)),
                         "customdata": [[b["lo"], b["hi"], b["steps"]] for b in bins],
                         "hovertemplate": "positions %{customdata[0]}–%{customdata[1]}: %{y:.2f} "
                                          "over %{customdata[2]} steps<extra>" + label + "</extra>"})
    extra: dict[str, Any] = {}
    if max_positions:
        extra["shapes"] = [{"type": "line", "xref": "x", "yref": "paper", "x0": max_positions,
                            "x1": max_positions, "y0": 0, "y1": 1,
                            "line": {"color": RED, "dash": "dash"}}]
        extra["annotations"] = [{"x": max_positions, "y": 1, "xref": "x", "yref": "paper",
                                 "text": "draft max_position_embeddings", "showarrow": False,
                                 "xanchor": "left"}]
    return _json(data, _layout({"title": _title("sequence position")},
                               {"title": _title("accept length"), "rangemode": "tozero"},
                               showlegend=len(runs) > 1, **extra))


def norms(runs: list[tuple[str, dict[str, Any]]], stats: dict[str, Any] | None = None) -> str | None:
    """Mean L2 norm over time of every captured aux layer and of fc's output, one line each (both
    runs in compare: A's in cool colours, B's in warm ones, dashed); the training band (q01..q99) per aux
    layer when known."""
    data = []
    for r, (label, summary) in enumerate(runs):
        series = summary.get("norms") or {}
        t0 = min((b["t0"] for s in series.values() for b in s if b.get("n")), default=0.0)
        for j, point in enumerate(sorted(series)):
            bins = [b for b in series[point] if b.get("n")]
            if not bins:
                continue
            name = point if len(runs) == 1 else f"{label}: {point}"
            palette = SERIES if len(runs) == 1 else RUN_SERIES[r % 2]
            data.append({"type": "scatter", "mode": "lines+markers", "name": name,
                         "x": [round(b["t0"] - t0, 3) for b in bins],
                         "y": [b["l2_mean"] for b in bins],
                         **_run_style(r, len(runs), palette[j % len(palette)]),
                         "hovertemplate": "%{x:.1f} s: %{y:.4g}<extra>" + name + "</extra>"})
    bands = [{"type": "rect", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": c["q01"],
              "y1": c["q99"], "fillcolor": SERIES[j % len(SERIES)], "opacity": 0.08, "line": {"width": 0}}
             for j, c in enumerate((stats or {}).get("aux") or [])]
    return _json(data, _layout({"title": _title("seconds since the first sample")},
                               {"title": _title("mean L2 norm per row")}, height=280, shapes=bands))


def _verdicts(step: dict[str, Any]) -> tuple[int, int, int]:
    """(accepted, rejected, not reached) drafted tokens of a step: a chain rejects at most its first
    position past the accepted ones; a tree rejects every node the target checked (under the root or an
    accepted node) and refused. A tree step whose shape was not read counts its accepted ones only."""
    flags, drafted, accepted = step["accept_flags"] or [], len(step["drafted_tokens"] or []), step["accept_len"] - 1
    parents = step.get("tree_parents")
    if parents:
        rejected = sum(1 for i, p in enumerate(parents) if not flags[i] and (p == 0 or flags[p - 1]))
    elif step["accept_flags"] == [] and drafted:
        return accepted, 0, 0
    else:
        rejected = 1 if accepted < drafted else 0
    return accepted, rejected, drafted - accepted - rejected


def timeline(steps: list[dict[str, Any]]) -> str | None:
    """One stacked bar per verify step: accepted drafts, the bonus token, the rejected ones (a chain: its
    first rejected position; a tree: every node the target refused), and the ones drafted past them. Click a
    bar for that step's detail."""
    if not steps:
        return None
    x = [s["step_index"] for s in steps]
    accepted, rejected, past = (list(v) for v in zip(*map(_verdicts, steps)))
    refused = "rejected" if any(s.get("tree_parents") for s in steps) else "first rejected"
    data = [{"type": "bar", "name": name, "x": x, "y": y, "marker": {"color": colour}, "customdata": x,
             "hovertemplate": "step %{x}: %{y} " + name + "<extra></extra>"}
            for name, y, colour in (("accepted", accepted, GREEN), ("bonus", [1] * len(x), BLUE),
                                    (refused, rejected, RED), ("not reached", past, GREY))]
    return _json(data, _layout({"title": _title("verify step (click for its detail)")},
                               {"title": _title("tokens"), "dtick": 1}, height=240,
                               barmode="stack", bargap=0.15, clickmode="event"))


def warm_up() -> None:
    """plotly.io sets up its JSON engine on first use (~150 ms): pay that at start, not on a page."""
    timeline([{"step_index": 0, "accept_flags": [True], "drafted_tokens": [1], "accept_len": 2}])

"""Plotly figures of the pages, built server-side from query results and sent as JSON.

Each builder is a pure function of plain data returning a figure's JSON text (``None`` when there is
nothing to draw); ``static/draftscope.js`` hands it to the vendored plotly.js.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

GREEN, RED, BLUE, GREY = "#2e7d32", "#c62828", "#1565c0", "#b0b7c3"
SERIES = ("#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#558b2f", "#4e342e", "#37474f")
RUN_COLOURS = ("#1565c0", "#ef6c00")  # compare: run A, run B


def _layout(height: int = 260, **kw: Any) -> dict[str, Any]:
    return {"height": height, "margin": {"l": 52, "r": 12, "t": 10, "b": 40},
            "font": {"family": "system-ui, sans-serif", "size": 12},
            "paper_bgcolor": "white", "plot_bgcolor": "white",
            "xaxis": {"gridcolor": "#eceff1", "zeroline": False},
            "yaxis": {"gridcolor": "#eceff1", "zeroline": False},
            "legend": {"orientation": "h", "y": -0.25}, **kw}


def _json(fig: go.Figure) -> str:
    return pio.to_json(fig, validate=False)


def per_position(runs: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Acceptance rate per draft position, one bar series per (label, summary)."""
    fig = go.Figure()
    for i, (label, summary) in enumerate(runs):
        rows = (summary.get("acceptance") or {}).get("per_position") or []
        if not rows:
            continue
        fig.add_bar(x=[r["position"] for r in rows], y=[r["rate"] for r in rows], name=label,
                    marker_color=RUN_COLOURS[i % 2] if len(runs) > 1 else BLUE,
                    customdata=[[r["accepted"], r["proposed"]] for r in rows],
                    hovertemplate="position %{x}: %{y:.1%} (%{customdata[0]} of %{customdata[1]})"
                                  "<extra>" + label + "</extra>")
    if not fig.data:
        return None
    fig.update_layout(_layout(barmode="group", showlegend=len(runs) > 1))
    fig.update_xaxes(title_text="draft position", dtick=1)
    fig.update_yaxes(title_text="accepted", tickformat=".0%", range=[0, 1])
    return _json(fig)


def accept_over_time(runs: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Traced accept length per time bin, seconds from each run's first bin."""
    fig = go.Figure()
    for i, (label, summary) in enumerate(runs):
        bins = [b for b in summary.get("over_time") or [] if b.get("steps")]
        if not bins:
            continue
        t0 = bins[0]["t0"]
        fig.add_scatter(x=[round(b["t0"] - t0, 3) for b in bins], y=[b["accept_length"] for b in bins],
                        mode="lines+markers", name=label, line_color=RUN_COLOURS[i % 2],
                        customdata=[b["steps"] for b in bins],
                        hovertemplate="%{x:.1f} s: %{y:.2f} over %{customdata} steps<extra>" + label + "</extra>")
    if not fig.data:
        return None
    fig.update_layout(_layout(showlegend=len(runs) > 1))
    fig.update_xaxes(title_text="seconds since the first sampled step")
    fig.update_yaxes(title_text="accept length", rangemode="tozero")
    return _json(fig)


def accept_by_seq_pos(runs: list[tuple[str, dict[str, Any]]],
                      max_positions: int | None = None) -> str | None:
    """Traced accept length against the sequence position of the verify step."""
    fig = go.Figure()
    for i, (label, summary) in enumerate(runs):
        bins = [b for b in summary.get("by_seq_pos") or [] if b.get("steps")]
        if not bins:
            continue
        fig.add_scatter(x=[(b["lo"] + b["hi"]) / 2 for b in bins], y=[b["accept_length"] for b in bins],
                        mode="lines+markers", name=label, line_color=RUN_COLOURS[i % 2],
                        customdata=[[b["lo"], b["hi"], b["steps"]] for b in bins],
                        hovertemplate="positions %{customdata[0]}–%{customdata[1]}: %{y:.2f} over "
                                      "%{customdata[2]} steps<extra>" + label + "</extra>")
    if not fig.data:
        return None
    fig.update_layout(_layout(showlegend=len(runs) > 1))
    if max_positions:
        fig.add_vline(x=max_positions, line_dash="dash", line_color=RED,
                      annotation_text="draft max_position_embeddings")
    fig.update_xaxes(title_text="sequence position")
    fig.update_yaxes(title_text="accept length", rangemode="tozero")
    return _json(fig)


def norms(runs: list[tuple[str, dict[str, Any]]], stats: dict[str, Any] | None = None) -> str | None:
    """Mean L2 norm over time of every captured aux layer and of fc's output, one line each (both
    runs in compare, dashed for B); the training band (q01..q99) per aux layer when known."""
    fig = go.Figure()
    for r, (label, summary) in enumerate(runs):
        series = summary.get("norms") or {}
        for j, point in enumerate(sorted(series)):
            bins = [b for b in series[point] if b.get("n")]
            if not bins:
                continue
            t0 = min(b["t0"] for s in series.values() for b in s if b.get("n"))
            name = point if len(runs) == 1 else f"{label}: {point}"
            fig.add_scatter(x=[round(b["t0"] - t0, 3) for b in bins], y=[b["l2_mean"] for b in bins],
                            mode="lines+markers", name=name,
                            line={"color": SERIES[j % len(SERIES)], "dash": "dash" if r else "solid"},
                            hovertemplate="%{x:.1f} s: %{y:.4g}<extra>" + name + "</extra>")
    if not fig.data:
        return None
    for j, chunk in enumerate((stats or {}).get("aux") or []):
        fig.add_hrect(y0=chunk["q01"], y1=chunk["q99"], fillcolor=SERIES[j % len(SERIES)], opacity=0.08,
                      line_width=0)
    fig.update_layout(_layout(height=280))
    fig.update_xaxes(title_text="seconds since the first sample")
    fig.update_yaxes(title_text="mean L2 norm per row")
    return _json(fig)


def timeline(steps: list[dict[str, Any]]) -> str | None:
    """One stacked bar per verify step: accepted drafts, the bonus token, the first rejected
    position, and positions drafted past it. Click a bar for that step's detail."""
    if not steps:
        return None
    x = [s["step_index"] for s in steps]
    accepted = [sum(bool(f) for f in s["accept_flags"] or []) for s in steps]
    drafted = [len(s["drafted_tokens"] or []) for s in steps]
    rejected = [1 if a < d else 0 for a, d in zip(accepted, drafted)]
    past = [d - a - r for a, d, r in zip(accepted, drafted, rejected)]
    fig = go.Figure()
    for name, y, colour in (("accepted", accepted, GREEN), ("bonus", [1] * len(x), BLUE),
                            ("first rejected", rejected, RED), ("not reached", past, GREY)):
        fig.add_bar(x=x, y=y, name=name, marker_color=colour, customdata=x,
                    hovertemplate="step %{x}: %{y} " + name + "<extra></extra>")
    fig.update_layout(_layout(height=240, barmode="stack", bargap=0.15, clickmode="event"))
    fig.update_xaxes(title_text="verify step (click for its detail)")
    fig.update_yaxes(title_text="tokens", dtick=1)
    return _json(fig)


def warm_up() -> None:
    """Plotly builds its validators on first use (~60 ms): pay that at start, not on a page view."""
    timeline([{"step_index": 0, "accept_flags": [True], "drafted_tokens": [1]}])
    norms([("a", {"norms": {"p": [{"t0": 0.0, "n": 1, "l2_mean": 1.0}]}})])

"""The HTML pages and their ``.json`` / ``.csv`` twins. Every route here only reads the store."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlencode

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from draftscope.findings import topk_gaps
from draftscope.spec.block import static_spec
from draftscope.spec.diff import combine, expected_widths, spec_diff
from draftscope.store import queries
from draftscope.store.imported_spec import imported_spec
from draftscope.store.stats import bins as stat_bins
from draftscope.web import charts, engine_compare
from draftscope.web.csv_export import attachment_name, csv_response
from draftscope.web.facts_view import fact_sections
from draftscope.web.templating import run_names, templates
from draftscope.web.tokens import decoder

router = APIRouter()
PAGE_SIZE = 50
ALL_ROWS = 10**9  # a CSV twin holds every row
RUN_CSV = ("id", "state", "status", "source", "engine", "engine_version", "algorithm", "target_path",
           "draft_path", "started_at", "ended_at", "requests_count", "mean_accept_length",
           "sglang_accept_length", "worst_severity", "worst_rule_id", "findings_count", "dropped",
           "requests_lost")
REQUEST_CSV = ("rid", "prompt_len", "output_len", "finish_reason", "sampled_steps", "spec_verify_ct",
               "traced_verify_ct", "spec_accepted_drafts", "traced_accepted_drafts",
               "spec_proposed_drafts", "traced_proposed_drafts", "spec_accept_length",
               "traced_accept_length", "started_at", "finished_at")
STEP_CSV = ("step_index", "at", "seq_pos", "accept_len", "accept_flags", "drafted_tokens",
            "bonus_token", "draft_topk", "target_topk", "tree_parents")
SAMPLE_CSV = ("point", "phase", "step_index", "at", "width", "rows", "dtype", "shape", "l2_mean",
              "l2_max", "mean", "std", "absmax", "nan_count", "inf_count")


RANDOM_WEIGHTS = "weights-random"  # the finding that says a model ran on random weights (findings.runtime)


def random_weights(findings: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's weights-random finding (its message says which model and flag), or None: every page
    that shows acceptance says it, as the run page does."""
    return next((f for f in findings if f["rule_id"] == RANDOM_WEIGHTS), None)


def download(response: Response, name: str, inline: bool = False) -> Response:
    """``response`` saved as ``name`` (letters, digits, ``.``, ``_`` and ``-`` only); ``inline``: a
    browser still shows it (a JSON twin), the name is for Save As."""
    kind = "inline" if inline else "attachment"
    response.headers["content-disposition"] = f'{kind}; filename="{attachment_name(name)}"'
    return response


class PageError(Exception):
    """A page cannot be shown: ``status`` with a message and what to do next."""

    def __init__(self, status: int, title: str, message: str, next_steps: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.status, self.title, self.message, self.next_steps = status, title, message, list(next_steps)


def _conn(request: Request):
    return request.app.state.engine.connect()


def _htmx(request: Request) -> bool:
    return bool(request.headers.get("hx-request"))


def _json(data: Any) -> Response:
    """``data`` as strict JSON: a stored value that is not a finite number becomes null."""
    return Response(orjson.dumps(data, default=_plain, option=orjson.OPT_NON_STR_KEYS),
                    media_type="application/json")


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _run_url(run_id: str) -> str:
    return "/runs/" + quote(run_id)


def _bad_query(exc: queries.BadQuery) -> PageError:
    return PageError(400, "Bad request", str(exc), ["Fix or remove that parameter in the address bar."])


def _not_found(exc: queries.NotFound) -> PageError:
    return PageError(404, "Not found", str(exc), ["Open the runs list to see every stored run."])


# --- runs list -----------------------------------------------------------------------------------

def _filters(status: str | None, q: str | None, severity: str | None, engine: str | None) -> dict[str, Any]:
    return {"status": status or None, "q": q or None, "severity": severity or None, "engine": engine or None}


def _runs(request: Request, sort: str, desc: bool, filters: dict[str, Any], cursor: str | None,
          limit: int) -> tuple[list[dict[str, Any]], str | None, int]:
    """One page of the runs list, the next page's cursor (None: last page) and how many runs match."""
    try:
        with _conn(request) as conn:
            runs, after = queries.runs_page(conn, cursor=cursor or None, limit=limit, sort=sort, desc=desc,
                                            **filters)
            total = queries.count_runs(conn, **filters)
    except queries.BadQuery as exc:
        raise _bad_query(exc) from None
    return runs, after, total


def _page_url(path: str, params: dict[str, Any]) -> str:
    return path + "?" + urlencode({k: (int(v) if isinstance(v, bool) else v) for k, v in params.items()
                                   if v is not None})


def next_link(request: Request, cursor: str | None) -> dict[str, str]:
    """The ``Link: <...>; rel="next"`` header of a page of runs (none on the last page): this
    request's address with ``cursor`` set."""
    if cursor is None:
        return {}
    url = _page_url(request.url.path, {**dict(request.query_params), "cursor": cursor})
    return {"link": f'<{url}>; rel="next"'}


PageSize = Query(queries.RUNS_PAGE_SIZE, ge=1, le=queries.MAX_RUNS_PAGE,
                 description="Runs per page; the Link header's rel=next address has the next page.")


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request, sort: str = "started_at", desc: bool = True,
              status: str | None = None, q: str | None = None, severity: str | None = None,
              engine: str | None = None, cursor: str | None = None, limit: int = PageSize):
    """Runs list, a page at a time: the root cause of each run as a badge; an htmx request gets
    only the table."""
    filters = _filters(status, q, severity, engine)
    runs, after, total = _runs(request, sort, desc, filters, cursor, limit)
    params = {k: v for k, v in filters.items() if v}
    size = {"limit": limit} if limit != queries.RUNS_PAGE_SIZE else {}

    def sort_url(key: str) -> str:
        return _page_url("/", {**params, **size, "sort": key, "desc": key != sort or not desc})

    page = {**params, **size, "sort": sort, "desc": desc}
    with _conn(request) as conn:
        findings = queries.findings_by_run(conn, [r["id"] for r in runs])
        names = run_names(runs, lambda ids: queries.run_facts(conn, ids))
    badges = {r["id"]: _finding_badges(findings.get(r["id"], [])) for r in runs}
    refresh = request.app.state.refresher.problem()
    context = {"runs": runs, "names": names, "badges": badges, "sort": sort, "desc": desc, "status_filter": status, "q": q,
               "severity": severity, "engine": engine, "engines": queries.ENGINES, "filtered": bool(params), "sort_url": sort_url,
               "self_url": _page_url("/", {**page, "cursor": cursor or None}),
               "next_url": _page_url("/", {**page, "cursor": after}) if after else None,
               "first_url": _page_url("/", page) if cursor else None, "total": total,
               "refresh_problem": refresh,
               "any_live": any(r["live"] for r in runs), "port": request.app.state.settings.port,
               "columns": [("started_at", "Run", False), ("state", "Status", False),
                           ("worst_severity", "Root cause", False),
                           ("mean_accept_length", "Accept length", True),
                           (None, "Per position", False), ("requests_count", "Requests", True),
                           ("target_path", "Target", False), ("engine", "Engine", False)]}
    return templates.TemplateResponse(request, "runs.html", context,
                                      block_name="runs_table" if _htmx(request) else None)


def _finding_badges(findings: list[dict[str, Any]]) -> dict[str, Any]:
    """A runs-list row's findings: the worst as its badge, random weights always in sight (acceptance
    means nothing then), the rest counted with their rule ids for the tooltip."""
    random = random_weights(findings)
    worst = next((f for f in findings if f is not random), None)
    if random and worst and worst["severity"] == "info":
        worst = None  # an acceptance finding made info by random weights: the random badge says why
    rest = [f["rule_id"] for f in findings if f is not random and f is not worst]
    return {"worst": worst, "random": random, "rest": rest}


@router.get("/runs.json")
def runs_json(request: Request, sort: str = "started_at", desc: bool = True,
              status: str | None = None, q: str | None = None, severity: str | None = None,
              engine: str | None = None, cursor: str | None = None, limit: int = PageSize):
    """The runs page as JSON: a list of runs; the next page's address in the ``Link`` header."""
    runs, after, _ = _runs(request, sort, desc, _filters(status, q, severity, engine), cursor, limit)
    response = _json(runs)
    response.headers.update(next_link(request, after))
    return response


@router.get("/runs.csv")
def runscsv_response(request: Request, sort: str = "started_at", desc: bool = True,
             status: str | None = None, q: str | None = None, severity: str | None = None,
             engine: str | None = None):
    """Every run that matches the filters (a download is not paged)."""
    try:
        with _conn(request) as conn:
            runs = queries.list_runs(conn, sort=sort, desc=desc, limit=ALL_ROWS,
                                     **_filters(status, q, severity, engine))
    except queries.BadQuery as exc:
        raise _bad_query(exc) from None
    return csv_response(runs, RUN_CSV, "runs.csv")


# --- run page ------------------------------------------------------------------------------------

def _reconcile(acc: dict[str, Any]) -> list[dict[str, Any]]:
    """SGLang's accept length and the tracer's, term by term (``run_summary``'s ``reconcile``)."""
    sg, rec = acc.get("sglang") or {}, acc.get("reconcile") or {}
    verify, tokens, steps = sg.get("verify_ct"), sg.get("output_len"), acc.get("verify_steps")
    if not verify or not steps:
        return []
    n, accepted = rec.get("prefill_tokens") or 0, sg.get("accepted")
    rows = [{"label": f"SGLang: output tokens ÷ verify steps ({acc.get('requests_counted')} finished "
                      "requests)", "verify": verify, "accepted": accepted, "tokens": tokens,
             "length": rec.get("sglang_accept_length")},
            {"label": f"… less the one token each request's prefill made ({n})", "verify": verify,
             "accepted": accepted, "tokens": tokens - n,
             "length": rec.get("sglang_accept_length_without_prefill")},
            {"label": "… = 1 + accepted drafts per verify step, by SGLang's counters"
                      + (f" ({rec['unexplained_tokens']} tokens cut at a stop)" if rec.get("unexplained_tokens") else ""),
             "verify": verify, "accepted": accepted, "tokens": verify + (accepted or 0),
             "length": rec.get("sglang_drafts_accept_length")},
            {"label": f"Tracer: 1 + accepted drafts per stored verify step ({rec.get('steps_not_sampled', 0)} "
                      "of SGLang's steps not sampled)", "verify": steps, "accepted": acc.get("accepted"),
             "tokens": steps + (acc.get("accepted") or 0), "length": acc.get("traced_accept_length")}]
    return rows


def _require_run(conn, run_id: str) -> dict[str, Any]:
    """The stored run, or a 404 page that says where runs appear."""
    run = queries.get_run(conn, run_id)
    if run is None:
        raise PageError(404, "Not found",
                        f"No run {run_id!r} is stored. A tracer's run appears once its first batch "
                        "has arrived; an imported trace once its import has finished.",
                        ["Open the runs list to see every stored run."])
    return run


def _summary_state(request: Request, conn, run_id: str) -> dict[str, Any]:
    """``queries.summary_state`` and, when this process's refresh of the run fails, since when and why."""
    state = queries.summary_state(conn, run_id)
    failure = request.app.state.refresher.run_problem(run_id)
    state["refresh_failed"] = None if failure is None else {"since": failure.since, "reason": failure.reason,
                                                            "attempts": failure.attempts}
    state["stale"] = state["stale"] or (failure is not None and state["behind"])
    return state


def _run_data(request: Request, conn, run_id: str) -> dict[str, Any]:
    run = _require_run(conn, run_id)
    summary = queries.run_summary(conn, run_id)
    findings = queries.run_findings(conn, run_id)
    static, stats = static_spec(run, imported_spec(conn, run_id))
    diff = combine(static, spec_diff(run, summary, stats))
    health = queries.latest_health(conn, run_id)
    return {"run": run, "summary": summary, "findings": findings, "diff": diff,
            "feature_stats": stats, "health": health,
            "topk_gaps": topk_gaps.run_gaps(stat_bins(conn, run_id, topk_gaps.SERIES), health,
                                            run.get("facts")),
            "imported": queries.imported_from(conn, run_id),
            "orphans": queries.orphan_requests(conn, run_id),
            "gaps": queries.run_gaps(conn, run_id),
            "last_batch_at": queries.last_batch_at(conn, run_id),
            "summary_state": _summary_state(request, conn, run_id),
            "reconcile": _reconcile(summary.get("acceptance") or {})}


def _figures(runs: list[tuple[str, dict[str, Any]]], stats: dict[str, Any] | None = None,
             max_positions: int | None = None) -> dict[str, str | None]:
    return {"per_position": charts.per_position(runs), "over_time": charts.accept_over_time(runs),
            "by_seq_pos": charts.accept_by_seq_pos(runs, max_positions),
            "norms": charts.norms(runs, stats)}


def _number(text: str | None, name: str) -> float | None:
    """A filter's number; an empty field (a cleared form input) is no filter."""
    if text is None or not text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        raise PageError(400, "Bad filter", f"{name} must be a number, not {text!r}.",
                        ["Clear the field or type a number such as 1.5."]) from None


def _request_filters(accept_min: float | None, accept_max: float | None, finding: str | None,
                     status: str | None, sort: str, desc: bool, offset: int) -> dict[str, Any]:
    if offset < 0:
        raise PageError(400, "Bad offset", f"offset must be 0 or more, not {offset}.")
    return {"accept_min": accept_min, "accept_max": accept_max, "finding": finding or None,
            "status": status or None, "sort": sort, "desc": desc, "offset": offset}


def _requests_context(conn, run: dict[str, Any], filters: dict[str, Any]) -> dict[str, Any]:
    try:
        rows, total = queries.run_requests_page(conn, run["id"], limit=PAGE_SIZE, **filters)
    except queries.BadQuery as exc:
        raise _bad_query(exc) from None
    base = f"/runs/{run['id']}/requests"

    def req_url(**change: Any) -> str:
        merged = {**filters, **change}
        return base + "?" + urlencode({k: (int(v) if isinstance(v, bool) else v)
                                       for k, v in merged.items() if v is not None})

    return {"requests": rows, "req_total": total, "req_offset": filters["offset"],
            "req_limit": PAGE_SIZE, "req_sort": filters["sort"], "req_desc": filters["desc"],
            "req_url": req_url, "req_filtered": any(filters[k] is not None for k in
                                                    ("accept_min", "accept_max", "finding", "status"))}


@router.get("/runs/{run_id}.json")
def run_json(request: Request, run_id: str):
    with _conn(request) as conn:
        data = _run_data(request, conn, run_id)
    data.pop("feature_stats")
    return download(_json(data), f"run-{run_id}.json", inline=True)


@router.get("/runs/{run_id}/spec.csv")
def run_speccsv_response(request: Request, run_id: str):
    with _conn(request) as conn:
        diff = _run_data(request, conn, run_id)["diff"]
    return csv_response((r.to_dict() for r in diff), ("key", "label", "trained", "predicted", "served",
                                             "state", "note"), f"run-{run_id}-spec.csv")


@router.get("/runs/{run_id}/findings.csv")
def run_findingscsv_response(request: Request, run_id: str):
    with _conn(request) as conn:
        _require_run(conn, run_id)
        rows = queries.run_findings(conn, run_id)
    return csv_response(rows, ("severity", "rule_id", "message", "fix", "rid", "first_step", "source",
                       "evidence"), f"run-{run_id}-findings.csv")


@router.get("/runs/{run_id}/requests.csv")
def run_requestscsv_response(request: Request, run_id: str):
    with _conn(request) as conn:
        _require_run(conn, run_id)
        rows, _ = queries.run_requests_page(conn, run_id, limit=ALL_ROWS)
    return csv_response(rows, REQUEST_CSV, f"run-{run_id}-requests.csv")


@router.get("/runs/{run_id}/requests", response_class=HTMLResponse)
def run_requests_fragment(request: Request, run_id: str, accept_min: str | None = None,
                          accept_max: str | None = None, finding: str | None = None,
                          status: str | None = None, sort: str = "started_at", desc: bool = False,
                          offset: int = Query(0)):
    """The run page's requests table (htmx): filtered, sorted, one page of it."""
    filters = _request_filters(_number(accept_min, "accept_min"), _number(accept_max, "accept_max"),
                               finding, status, sort, desc, offset)
    with _conn(request) as conn:
        run = _require_run(conn, run_id)
        context = {"run": run, **_requests_context(conn, run, filters)}
    return templates.TemplateResponse(request, "requests_table.html", context)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: str):
    """One run: diagnosis, trained-vs-served spec diff, acceptance and feature charts, requests,
    tracer health, attach-time facts. While it runs, htmx refreshes the charts every 5 s."""
    with _conn(request) as conn:
        data = _run_data(request, conn, run_id)
        run = data["run"]
        filters = _request_filters(None, None, None, None, "started_at", False, 0)
        context = {**data, **_requests_context(conn, run, filters)}
        others = [r for r in queries.list_runs(conn, limit=50) if r["id"] != run_id]
    findings = data["findings"]
    draft_max = ((run.get("facts") or {}).get("draft") or {}).get("max_position_embeddings")
    reached = max((b["hi"] for b in data["summary"].get("by_seq_pos") or []), default=0)
    draft_max = draft_max if draft_max and reached >= draft_max / 2 else None  # else it squashes the data
    context.update(has_predicted=any(r.predicted for r in data["diff"]),
                   run_url=_run_url(run_id), root=findings[0] if findings and findings[0]["severity"] != "info" else None,
                   rest=findings[1:] if findings and findings[0]["severity"] != "info" else findings,
                   charts=_figures([("run", data["summary"])], data["feature_stats"], draft_max),
                   fact_sections=fact_sections(run.get("facts")), other_runs=others,
                   random=random_weights(findings),
                   finding_rules=sorted({f["rule_id"] for f in findings if f.get("rid")}))
    return templates.TemplateResponse(request, "run.html", context,
                                      block_name="live" if _htmx(request) else None)


# --- request page --------------------------------------------------------------------------------

def _sample_groups(samples: list[dict[str, Any]], expected: dict[str, int | None]) -> list[dict[str, Any]]:
    """Samples grouped by (point, phase), with the draft input's expected width per phase."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for s in samples:
        g = groups.setdefault((s["point"], s["phase"]), {
            "point": s["point"], "phase": s["phase"], "count": 0, "widths": set(), "rows": 0,
            "l2_sum": 0.0, "l2_n": 0, "l2_max": None, "absmax": None, "nan_count": 0, "inf_count": 0})
        g["count"] += 1
        g["widths"].add(s["width"])
        g["rows"] = max(g["rows"], s["rows"] or 0)
        if s["l2_mean"] is not None:
            g["l2_sum"] += s["l2_mean"]
            g["l2_n"] += 1
        for key in ("l2_max", "absmax"):
            if s[key] is not None and (g[key] is None or s[key] > g[key]):
                g[key] = s[key]
        g["nan_count"] += s["nan_count"] or 0
        g["inf_count"] += s["inf_count"] or 0
    out = []
    for g in groups.values():
        exp = expected.get(g["phase"]) if g["point"] == "draft.input" else None
        out.append({**g, "widths": sorted(g["widths"]), "expected": exp,
                    "l2_mean": g["l2_sum"] / g["l2_n"] if g["l2_n"] else None,
                    "width_mismatch": exp is not None and any(w != exp for w in g["widths"]),
                    "nonfinite": g["nan_count"] + g["inf_count"] > 0})
    return out


def _step_rows(step: dict[str, Any]) -> list[dict[str, Any]]:
    """Per drafted position (a tree: per node, with its depth and parent): the verdict (accepted, first
    rejected or rejected, not reached) and both top-k."""
    flags, rows, rejected = step["accept_flags"] or [], [], False
    draft, target = step.get("draft_topk") or [], step.get("target_topk") or []
    parents = step.get("tree_parents")
    depth = [0]
    for i, token in enumerate(step["drafted_tokens"] or []):
        flag = flags[i] if i < len(flags) else None
        if parents is not None:  # a tree: a node the target checked is one under the root or an accepted node
            parent = parents[i]
            depth.append(depth[parent] + 1)
            checked = parent == 0 or bool(flags[parent - 1])
            verdict = "accepted" if flag else "rejected" if checked else "not reached"
        elif rejected:
            verdict = "not reached"
        elif flag:
            verdict = "accepted"
        elif flag is None:
            verdict = "not recorded"
        else:
            verdict, rejected = "first rejected", True
        d, t = (draft[i] if i < len(draft) else []), (target[i] if i < len(target) else [])
        rows.append({"position": depth[-1] if parents is not None else i + 1, "node": i + 1,
                     "parent": parents[i] if parents is not None else None, "token": token, "verdict": verdict,
                     "draft_topk": d or [], "target_topk": t or [],
                     "agree": bool(d and t and int(d[0][0]) == int(t[0][0]))})
    return rows


def _step_tree(rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """A tree step's nodes nested under their parents (the root's children first), for the request page's
    drawing; None for a chain."""
    if not rows or rows[0]["parent"] is None:
        return None
    nodes = {0: {"children": []}} | {r["node"]: {**r, "children": []} for r in rows}
    for r in rows:
        nodes.get(r["parent"], nodes[0])["children"].append(nodes[r["node"]])
    return nodes[0]["children"]


def _request_data(conn, run_id: str, rid: str, step_index: int | None = None) -> dict[str, Any]:
    try:
        data = queries.request_view(conn, run_id, rid)
    except queries.NotFound as exc:
        raise _not_found(exc) from None
    req = data["request"]
    if req.get("row_missing"):
        incomplete = ("No request record is stored for this id: the request was still running, or "
                      "its finish record was dropped (the run's tracer health counts drops). Its "
                      "stored steps and samples follow; its prompt, output and SGLang counters are unknown.")
    elif req.get("missing_steps"):
        incomplete = (f"{req['missing_steps']} of the {req['expected_steps']} verify steps the tracer "
                      "recorded for this request are missing from the store (dropped).")
    elif req.get("mismatches"):
        incomplete = (f"SGLang's counters and the tracer's totals differ ({', '.join(req['mismatches'])}): "
                      "the tracer missed some of this request's verify steps.")
    else:
        incomplete = None
    run, steps = data["run"], data["steps"]
    expected = expected_widths(run.get("facts"))
    for s in steps:
        s["topk_lost"] = topk_gaps.step_gaps(s, run.get("facts"))
    step = None
    if step_index is not None:
        step = next((s for s in steps if s["step_index"] == step_index), None)
        if step is None:
            raise PageError(404, "Step not found", f"Request {rid!r} has no sampled verify step "
                            f"{step_index}.", ["Pick a step from the request's timeline."])
    samples = data["samples"]
    rows = _step_rows(step) if step else []
    findings = queries.run_findings(conn, run_id)
    root = findings[0] if findings and findings[0]["severity"] != "info" else None
    return {"run": run, "req": req, "random": random_weights(findings), "root": root, "steps": steps, "samples": samples, "incomplete": incomplete,
            "step": step, "step_rows": rows, "step_tree": _step_tree(rows),
            "step_samples": _sample_groups([s for s in samples if s["step_index"] == step_index],
                                           expected) if step else [],
            "sample_groups": _sample_groups(samples, expected), "expected_widths": expected,
            "traced_accept_length": (sum(s["accept_len"] for s in steps) / len(steps)) if steps else None}


def _split_rid(rest: str) -> tuple[str, str, int | None]:
    """``rid``, ``rid.json``, ``rid/steps.csv``, ``rid/samples.csv`` or ``rid/steps/N``."""
    for suffix, kind in (("/steps.csv", "steps.csv"), ("/samples.csv", "samples.csv"), (".json", "json")):
        if rest.endswith(suffix):
            return rest[: -len(suffix)], kind, None
    head, _, tail = rest.rpartition("/steps/")
    if head and tail.isdigit():
        return head, "step", int(tail)
    return rest, "page", None


@router.get("/runs/{run_id}/requests/{rest:path}", response_class=HTMLResponse)
def request_page(request: Request, run_id: str, rest: str):
    """One request: its verify-step timeline (click a step for draft vs target top-k), tensor
    samples against the expected widths; ``.json``, ``/steps.csv``, ``/samples.csv`` twins."""
    with _conn(request) as conn:
        exact = queries.get_request(conn, run_id, rest) is not None
        rid, kind, step_index = (rest, "page", None) if exact else _split_rid(rest)
        data = _request_data(conn, run_id, rid, step_index)
    name = f"run-{run_id}-request-{rid}"
    if kind == "json":
        return download(_json({k: data[k] for k in ("run", "req", "steps", "samples", "incomplete",
                                                    "expected_widths", "traced_accept_length")}),
                        f"{name}.json", inline=True)
    if kind == "steps.csv":
        return csv_response(data["steps"], STEP_CSV, f"{name}-steps.csv")
    if kind == "samples.csv":
        return csv_response(data["samples"], SAMPLE_CSV, f"{name}-samples.csv")
    decode = decoder(data["run"].get("target_path"))
    run_url = _run_url(run_id)
    context = {**data, "decode": decode, "timeline_figure": charts.timeline(data["steps"]),
               "run_url": run_url, "req_url": f"{run_url}/requests/{quote(rid)}",
               "topk_parts": topk_gaps.PARTS}
    if kind == "step" and _htmx(request):
        return templates.TemplateResponse(request, "request.html", context, block_name="step_detail")
    return templates.TemplateResponse(request, "request.html", context)


# --- compare -------------------------------------------------------------------------------------

def _compare_ids(a: str | None, b: str | None, run: list[str]) -> tuple[str | None, str | None]:
    ids = [x for x in (a, b, *run) if x]
    if len(ids) == 1 or len(ids) > 2:
        raise PageError(400, "Pick two runs", f"Compare takes exactly two runs; {len(ids)} were given.",
                        ["Tick two runs in the runs list, or use ?a=RUN&b=RUN."])
    return (ids[0], ids[1]) if ids else (None, None)


def _side(request: Request, conn, run_id: str) -> dict[str, Any]:
    data = _run_data(request, conn, run_id)
    f = data["findings"]
    return {**data, "root": f[0] if f and f[0]["severity"] != "info" else None, "random": random_weights(f)}


def _compare_data(request: Request, conn, a_id: str, b_id: str) -> dict[str, Any]:
    a, b = _side(request, conn, a_id), _side(request, conn, b_id)
    rows_a, rows_b = {r.key: r for r in a["diff"]}, {r.key: r for r in b["diff"]}
    keys = list(rows_a) + [k for k in rows_b if k not in rows_a]
    pairs = [((rows_a.get(k) or rows_b[k]).label, rows_a.get(k), rows_b.get(k)) for k in keys]
    fed = engine_compare.block(a["run"], a["summary"], b["run"], b["summary"])
    return {"a": a, "b": b, "diff_pairs": pairs, "engines": fed}


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, a: str | None = None, b: str | None = None,
                 run: list[str] = Query(default=[])):
    """Two runs side by side: spec diff, per-position acceptance, accept length, norms overlaid."""
    a_id, b_id = _compare_ids(a, b, run)
    with _conn(request) as conn:
        if a_id is None:
            return templates.TemplateResponse(request, "compare.html", {
                "a": None, "other_runs": queries.list_runs(conn, limit=50)})
        data = _compare_data(request, conn, a_id, b_id)
    label_a, label_b = f"A {a_id[:8]}", f"B {b_id[:8]}"
    figures = _figures([(label_a, data["a"]["summary"]), (label_b, data["b"]["summary"])])
    return templates.TemplateResponse(request, "compare.html", {**data, "charts": figures})


@router.get("/compare.json")
def compare_json(request: Request, a: str | None = None, b: str | None = None,
                 run: list[str] = Query(default=[])):
    a_id, b_id = _compare_ids(a, b, run)
    if a_id is None:
        raise PageError(400, "Pick two runs", "compare.json needs two runs.", ["Use ?a=RUN&b=RUN."])
    with _conn(request) as conn:
        data = _compare_data(request, conn, a_id, b_id)
    side = ("run", "summary", "findings", "diff")
    return download(_json({"a": {k: data["a"][k] for k in side}, "b": {k: data["b"][k] for k in side},
                           "engines": data["engines"]}), f"compare-run-{a_id}-run-{b_id}.json", inline=True)


def error_response(request: Request, exc: PageError) -> Response:
    """A page error as HTML, or JSON for a ``.json`` twin."""
    if request.url.path.endswith(".json") or request.url.path.endswith(".csv"):
        return JSONResponse({"error": exc.title, "detail": exc.message, "next": exc.next_steps},
                            status_code=exc.status)
    return templates.TemplateResponse(request, "error.html", {
        "title": exc.title, "message": exc.message, "next_steps": exc.next_steps},
        status_code=exc.status)


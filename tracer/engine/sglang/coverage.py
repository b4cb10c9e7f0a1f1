"""Every hook accounted for: which ones SGLang applied, whether the running workers go through them,
and whether the ones that must fire on a sampled decode did.

SGLang's ``HookRegistry.apply_hooks`` logs a failure and goes on, and a speculative worker that does
not inherit ``EAGLEWorkerV2``'s methods unchanged (multi-layer EAGLE, DFlash, DSpark, NGRAM, ...)
never calls them: without these checks either would leave an empty run and no word.
"""

from __future__ import annotations

import logging
import pkgutil
from typing import Any, Callable, Dict, List, Mapping, Optional

log = logging.getLogger("draftscope.tracer")
# Hooks on the speculative worker (``scheduler.draft_worker``) and on its draft worker.
SPEC_HOOKS = ("verify",)
DRAFT_HOOKS = ("draft", "prefill", "draft_extend")
# Hooks that fire on every decode iteration of a sampled request, and its finish.
MUST_FIRE = ("prefill", "draft", "verify", "draft_extend", "finish")


def _resolve(target: str):
    owner_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    return owner, attr


def applied(target: str, hook: Callable) -> bool:
    """``hook`` is in the wrapper chain now bound at ``target`` (SGLang's wrappers keep ``__wrapped__``)."""
    try:
        owner, attr = _resolve(target)
        fn = getattr(owner, attr)
    except Exception:
        return False
    seen = set()
    while callable(fn) and id(fn) not in seen:
        seen.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # an empty cell
                pass
        fn = getattr(fn, "__wrapped__", None)
    return False


def reaches(worker: Any, target: str) -> bool:
    """``worker`` calls the hooked method: it is an instance of the owner and does not override it."""
    try:
        owner, attr = _resolve(target)
    except Exception:
        return False
    return worker is not None and isinstance(worker, owner) and \
        getattr(type(worker), attr, None) is getattr(owner, attr, None)


def _attr(obj: Any, *names: str) -> Any:
    """``obj.a.b...``, or None when any step fails (a worker's ``__getattr__`` may raise anything)."""
    for name in names:
        try:
            obj = getattr(obj, name, None)
        except Exception:
            return None
    return obj


def _name(obj: Any) -> Optional[str]:
    return None if obj is None else type(obj).__name__


def check(scheduler: Any, hooks: Mapping[str, Any]) -> Dict[str, Any]:
    """``facts["tracing"]`` for ``hooks`` (name -> ``hooks.HookHandle``): the workers and algorithm found, the hooks SGLang did not apply, the
    worker hooks the running workers never call, whether the spec worker is covered at all, and the
    hooks that must fire on a sampled request (``expected_to_fire``, checked by :func:`not_fired`)."""
    spec = _attr(scheduler, "draft_worker")
    draft = _attr(spec, "draft_worker")
    algorithm = _attr(spec, "speculative_algorithm", "name") or _attr(scheduler, "spec_algorithm", "name")
    not_applied = sorted(name for name, h in hooks.items() if not applied(h.target, h.hook))
    by_worker = {**{n: spec for n in SPEC_HOOKS}, **{n: draft for n in DRAFT_HOOKS}}
    not_reached = sorted(n for n, w in by_worker.items() if n in hooks and not reaches(w, hooks[n].target))
    covered = spec is not None and not not_reached
    return {"worker_class": _name(spec), "draft_worker_class": _name(draft), "algorithm": algorithm,
            "covered": covered, "hooks_not_applied": not_applied, "hooks_not_reached": not_reached,
            "expected_to_fire": [n for n in MUST_FIRE if n not in not_applied and n not in not_reached]}


def uncovered_message(tracing: Mapping[str, Any]) -> Optional[str]:
    """The one line for SGLang's log when the running worker is not traced, else None."""
    if tracing.get("covered"):
        return None
    worker = tracing.get("worker_class")
    if worker is None:
        return "this server runs no speculative decoding: draftscope records its requests and nothing else"
    return (f"this server runs {worker} (algorithm {tracing.get('algorithm')}): draftscope traces nothing "
            f"of it (hooks its workers never call: {', '.join(tracing.get('hooks_not_reached') or [])})")


def not_fired(expected: List[str], heartbeats: Mapping[str, int]) -> List[str]:
    """The hooks in ``expected`` that have not fired yet."""
    return [name for name in expected if not heartbeats.get(name)]


def account_for(scheduler: Any, hooks: Mapping[str, Any]) -> Dict[str, Any]:
    """:func:`check`, with one WARNING in SGLang's log for an uncovered worker and one for missing hooks."""
    tracing = check(scheduler, hooks)
    message = uncovered_message(tracing)
    if message:
        log.warning("draftscope: %s", message)
    if tracing["hooks_not_applied"]:
        log.warning("draftscope: SGLang did not apply the tracer's hooks %s (see \"Failed to apply hooks\" "
                    "above): what they record is missing", ", ".join(tracing["hooks_not_applied"]))
    return tracing


def warn_not_fired(expected: List[str], heartbeats: Mapping[str, int], rid: str, verify_ct: int) -> None:
    """The check after the first sampled request with verify steps: one WARNING naming hooks that never fired."""
    missing = not_fired(expected, heartbeats)
    if missing:
        log.warning("draftscope: hooks %s never fired during sampled request %s (%d verify steps): "
                    "their records are missing", ", ".join(missing), rid, verify_ct)

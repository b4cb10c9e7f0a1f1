"""Where a served step's time goes with the tracer attached: torch profiles of the Kimi-K2.5-shaped server.

The GPU runner's ``kimi-profile`` phase (``testbed/gpu/kimi_phase.py``) profiles the healthy server without the
tracer and with every request sampled, at 1 and 8 concurrent requests (and once with Python stacks), through
SGLang's ``/start_profile``; ``testbed/gpu/profile_summary.py`` turns each trace into per-step figures. On the
device, then here::

    RUNNER_LIMIT_S=545 bash .cache/gpu-kit/run.sh --only kimi-profile   # results.json -> kimi_profile_summary
    python bench/gpu_profile.py results.json                             # the table docs/benchmarks.md shows
    python bench/gpu_profile.py traces/profiles/every-c1-TP-0.trace.json.gz --steps 40   # one trace, JSON
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script, too

from testbed.gpu.profile_summary import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

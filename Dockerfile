# The draftscope dashboard: store, ingest API and pages, with the demo traces recorded from the real
# SGLang engine on CPU (demo/). It installs the wheel built from this tree (as users install it),
# not an editable tree. Python packages come from PyPI, or only from ./wheels when built with
# --build-arg PIP_NO_INDEX=1 (machines whose containers cannot reach PyPI: scripts/wheelhouse).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS wheel
ARG PIP_NO_INDEX=0
ENV PIP_NO_INDEX=${PIP_NO_INDEX} PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1
COPY wheels/ /wheels/
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app/ app/
COPY tracer/ tracer/
COPY migrations/ migrations/
COPY templates/ templates/
COPY static/ static/
RUN python3 -m pip wheel --no-cache-dir --no-deps -w /dist .

FROM ${BASE_IMAGE}
ARG PIP_NO_INDEX=0
ENV PIP_NO_INDEX=${PIP_NO_INDEX} PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY wheels/ /wheels/
COPY --from=wheel /dist/ /dist/
RUN python3 -m pip install --no-cache-dir "$(ls /dist/draftscope-*.whl)[dashboard]" && rm -rf /wheels /dist
RUN useradd --system --create-home draftscope && mkdir -p /data && chown draftscope /data
WORKDIR /srv/draftscope
COPY demo/ demo/
USER draftscope
ENV DRAFTSCOPE_DATABASE_URL=sqlite:////data/draftscope.db
EXPOSE 8177
CMD ["draftscope", "serve", "--host", "0.0.0.0", "--port", "8177", "--upgrade", "--demo", "demo"]

# The draftscope dashboard: store, ingest API and pages, with the demo traces recorded from the real
# SGLang engine on CPU (demo/). Python packages come from PyPI, or only from ./wheels when built
# with --build-arg PIP_NO_INDEX=1 (machines whose containers cannot reach PyPI: scripts/wheelhouse).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ARG PIP_NO_INDEX=0
ENV PIP_NO_INDEX=${PIP_NO_INDEX} PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /srv/draftscope
COPY wheels/ /wheels/
COPY pyproject.toml README.md ./
COPY app/ app/
COPY tracer/ tracer/
COPY migrations/ migrations/
COPY templates/ templates/
COPY static/ static/
COPY demo/ demo/
RUN python3 -m pip install --no-cache-dir -e ".[dashboard]" && rm -rf /wheels
RUN useradd --system --create-home draftscope && mkdir -p /data && chown draftscope /data
USER draftscope
ENV DRAFTSCOPE_DATABASE_URL=sqlite:////data/draftscope.db
EXPOSE 8177
CMD ["draftscope", "serve", "--host", "0.0.0.0", "--port", "8177", "--upgrade", "--demo", "demo"]

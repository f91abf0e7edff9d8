# syntax=docker/dockerfile:1
# The fleet image: one image for every fleet role (api, worker, reconciler, webhooks,
# local-substrate); the role is the command (`atefleet api`, `atefleet worker`, ...).
#
#   docker build -t atefleet .
#   docker run --rm -p 7777:7777 atefleet api
#
# The guest (the tool server inside each actor) has its own image: Dockerfile.guest.

# --- build: wheels for the package and all its dependencies -----------------------------------
FROM python:3.11-slim AS build
WORKDIR /src
# The whole build context (filtered by .dockerignore), so the build does not depend on which
# files the package happens to need today (Lua scripts, proto stubs, package data).
COPY . .
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# --- runtime ------------------------------------------------------------------------------------
FROM python:3.11-slim
# bubblewrap: local-substrate's preferred sandbox; without it the sandbox falls back to
# `unshare` (util-linux, already present) and the fallback is reported by /healthz.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
# Fixed uid/gid so Kubernetes securityContext (runAsUser 10001) and volume ownership match.
RUN groupadd --system --gid 10001 atefleet \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/atefleet --shell /usr/sbin/nologin atefleet \
    && mkdir -p /var/lib/atefleet /etc/atefleet \
    && chown atefleet:atefleet /var/lib/atefleet
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels atefleet \
    && rm -rf /wheels

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ATEFLEET_STATE_DIR=/var/lib/atefleet
WORKDIR /var/lib/atefleet
USER 10001:10001
# 7777: the API; 9100: /healthz, /readyz and /metrics of the other roles (--metrics-port 9100).
EXPOSE 7777 9100
ENTRYPOINT ["atefleet"]
CMD ["api"]

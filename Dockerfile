# The gateway image: locked dependencies in a layer of their own, then the code.
# A code change rebuilds from step 2 on; only a change of requirements.lock
# (bash scripts/lock.sh) reinstalls the dependencies. .dockerignore lets in
# only what is copied here (never deploy/secrets, deploy/tls or .env).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin app

WORKDIR /app

# 1. The dependencies, exactly as locked (hashes checked), the build backend included.
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock

# 2. The code: no dependency resolution, no build backend fetched (both locked above).
#    The fan-out's C loop (setup.py) is compiled here, with a compiler that leaves
#    in the same step; the sources go too, so `python -m gateway` (run from this
#    directory) imports the installed package, C loop included.
COPY pyproject.toml setup.py README.md ./
COPY core ./core
COPY gateway ./gateway
COPY router ./router
COPY store ./store
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-deps --no-build-isolation . \
    && (cd / && python -c "import gateway.wire as w; assert w.FANOUT == 'c', w.FANOUT") \
    && pip check \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* build ./*.egg-info core gateway router store

# Secrets from /run/secrets into the IM_* settings, then `python -m gateway ARGS`.
COPY deploy/gateway-entrypoint.py /usr/local/bin/imgate-entrypoint

USER app

EXPOSE 8080 8081 9464

ENTRYPOINT ["python", "/usr/local/bin/imgate-entrypoint"]
CMD ["serve"]

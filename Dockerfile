FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# .dockerignore keeps the venv, caches, tests and local data out of the context.
COPY . .
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin app

USER app

EXPOSE 8080 8081

CMD ["python", "-m", "gateway", "serve"]

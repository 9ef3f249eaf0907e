# dlqapp worker image: `docker compose up` builds it.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY dlqapp ./dlqapp
RUN pip install --no-cache-dir .
ENV DLQ_WEB_HOST=0.0.0.0 \
    DLQ_DATA_DIR=/data
VOLUME /data
EXPOSE 6066
CMD ["faust", "-A", "dlqapp", "worker", "-l", "info"]

# Planner service image. The app finds migrations/ relative to the repo, so the
# whole repo lives in /srv/planner and is installed in editable mode.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PLANNER_HOST=0.0.0.0 \
    PLANNER_PORT=8080

WORKDIR /srv/planner
COPY . .
RUN pip install --no-cache-dir -e .

EXPOSE 8080
# Listening on 0.0.0.0 requires PLANNER_API_TOKENS (see docker-compose.yml).
CMD ["planner", "serve"]

# The control plane: web (gunicorn + whitenoise), Celery worker and Celery beat share this image.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    DATA_DIR=/var/lib/fleet STATIC_ROOT=/srv/static

WORKDIR /srv/app
COPY pyproject.toml ./
COPY config ./config
COPY fleet ./fleet
COPY runs ./runs
COPY training ./training
COPY templates ./templates
COPY static ./static
COPY manage.py ./
COPY docker/onstart.sh ./docker/onstart.sh
RUN pip install . \
    && mkdir -p "$DATA_DIR" \
    && SECRET_KEY=build-only python manage.py collectstatic --noinput \
    && useradd --system --home /srv/app fleet \
    && chown -R fleet "$DATA_DIR"
USER fleet
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]

# The control plane: web (gunicorn + whitenoise), Celery worker and Celery beat share this image.
#
# The base is pinned by digest once one is recorded in PYTHON_DIGEST; none is yet. `docker buildx imagetools inspect
# python:3.12-slim` prints it: set it as the default below or pass --build-arg PYTHON_DIGEST=sha256:... Left empty,
# the build takes whatever the tag names on the day.
ARG PYTHON_DIGEST=
FROM python:3.12-slim${PYTHON_DIGEST:+@${PYTHON_DIGEST}}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    DATA_DIR=/var/lib/fleet STATIC_ROOT=/srv/static

WORKDIR /srv/app
# Every package at its locked version and hash (requirements/, made by scripts/lock), the build backend included,
# so that the project itself installs with nothing resolved or fetched.
COPY requirements/pip.txt requirements/control-plane.txt ./requirements/
RUN pip install --require-hashes --no-deps -r requirements/pip.txt \
    && pip install --require-hashes --no-deps -r requirements/control-plane.txt
COPY pyproject.toml ./
COPY config ./config
COPY fleet ./fleet
COPY runs ./runs
COPY training ./training
COPY templates ./templates
COPY static ./static
COPY manage.py ./
COPY docker/onstart.sh ./docker/onstart.sh
RUN pip install --no-deps --no-build-isolation . \
    && pip check \
    && mkdir -p "$DATA_DIR" \
    && SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')" python manage.py collectstatic --noinput \
    && useradd --system --home /srv/app fleet \
    && chown -R fleet "$DATA_DIR"
USER fleet
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]

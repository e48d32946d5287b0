"""Settings of the reminders site: only what it uses, plus duetime's two."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "only-for-the-example-set-your-own")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
INSTALLED_APPS = ["reminders"]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "reminders_site.urls"
WSGI_APPLICATION = "reminders_site.wsgi.application"
DATABASES: dict[str, dict[str, str]] = {}  # the example keeps nothing of its own
USE_TZ = True
DEFAULT_FROM_EMAIL = "reminders@example.com"

# duetime: the queue the site schedules on, and the server. None means
# $DUETIME_REDIS_URL, else the embedded server (the same one for the web processes and
# for `manage.py runduetime`, as long as they run under one user).
DUETIME_QUEUE = "reminders"
DUETIME_REDIS_URL = os.environ.get("DUETIME_REDIS_URL")

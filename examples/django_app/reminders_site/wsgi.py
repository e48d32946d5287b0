"""The WSGI entry point (gunicorn reminders_site.wsgi): the web side only; the duetime
side runs as `python manage.py runduetime`."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reminders_site.settings")
application = get_wsgi_application()

#!/usr/bin/env python
"""Django's command line for the reminders site: `python manage.py runserver` serves it,
`python manage.py runduetime` runs its duetime dispatcher and worker."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reminders_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)

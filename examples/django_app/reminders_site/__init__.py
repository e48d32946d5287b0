"""The reminders site: a small Django project that schedules work with duetime."""

"""The site's routes: schedule a reminder, and look at one."""

from django.urls import path
from reminders import views

urlpatterns = [
    path("reminders", views.schedule_reminder),
    path("reminders/<str:task_id>", views.show_reminder),
]

"""Schedule a reminder (POST /reminders) and look at one (GET /reminders/<id>), in JSON."""

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from duetime.errors import InvalidInputError
from reminders.queue import reminders_queue
from reminders.tasks import send_reminder


@csrf_exempt  # a JSON API for other programs; a site with forms keeps CSRF checks
@require_POST
def schedule_reminder(request: HttpRequest) -> JsonResponse:
    try:
        body: Any = json.loads(request.body)
        to, delay = body["to"], body.get("in_seconds", 0)
    except (ValueError, TypeError, KeyError, AttributeError):
        return JsonResponse({"error": 'send {"to": ..., "in_seconds": ...}'}, status=400)
    try:
        task_id = reminders_queue().schedule_in(
            delay, {"to": to}, task=send_reminder, result_ttl=3600
        )
    except InvalidInputError as error:  # duetime's message says what to fix
        return JsonResponse({"error": str(error)}, status=400)
    return JsonResponse({"id": task_id}, status=201)


@require_GET
def show_reminder(request: HttpRequest, task_id: str) -> JsonResponse:
    try:
        status = reminders_queue().status(task_id)
    except InvalidInputError as error:
        return JsonResponse({"error": str(error)}, status=400)
    if status is None:
        return JsonResponse({"error": f"no reminder {task_id!r}"}, status=404)
    return JsonResponse({"id": task_id, "state": str(status.state), "result": status.result})

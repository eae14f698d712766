"""The check-in a serving box's watchdog posts: answered with a fresh token while the dashboard wants the box, refused
(the box then stops its own machine) once it does not (docs/fleet.md, "fleet/inference/checkin.py")."""

from django.contrib.auth.decorators import login_not_required
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from fleet.inference import checkin, replicas


@csrf_exempt  # a box authenticates by its bearer token, never by a browser's cookie
@login_not_required
@require_POST
def checkin_view(request, pk: int):
    header = request.headers.get("Authorization", "")
    box = checkin.instance_for(header.removeprefix("Bearer ").strip(), pk)
    if box is None:
        return JsonResponse({"detail": "This token does not open this box's check-in."}, status=401)
    now = timezone.now()
    refusal = replicas.checkin_refusal(state=box.state, serves_model=box.serving_model_id is not None,
                                       kept=box.keep_until is not None and box.keep_until > now)
    if refusal:
        return JsonResponse({"detail": f"The dashboard no longer wants this box: {refusal}."}, status=403)
    return JsonResponse({"command": "continue", "token": checkin.issue(box)})

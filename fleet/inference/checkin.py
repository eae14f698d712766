"""A serving box's check-in with the dashboard, its dead-man switch: the box's own expiring token, and what the box is
rented with to run the watchdog beside vLLM (docs/fleet.md, "fleet/inference/checkin.py")."""

import base64
import zlib
from pathlib import Path

import training
from django.conf import settings
from django.core import signing

from fleet.models import Instance

PREFIX = "serve_"
_SIGNER = signing.TimestampSigner(salt="fleet.serving-checkin.v1")
ENV = "FLEET_WATCHDOG"  # the watchdog's program, in parts as the adapter's grant is
ENV_PART = 200  # characters of one variable: vast.ai takes at most 256 for a name and its value
_AGENT = Path(training.__file__).with_name("agent")
# The training box's own self-stop, not a copy: the box gets its text beside the watchdog's, as the modules of a
# package made in memory (the watchdog imports it as .self_stop), so nothing is written to the box's disk.
LOADER = """import sys, types
files = {files!r}
package = types.ModuleType("fleet_watchdog")
package.__path__ = []
sys.modules[package.__name__] = package
stop = types.ModuleType("fleet_watchdog.self_stop")
sys.modules[stop.__name__] = stop
exec(compile(files["self_stop.py"], "self_stop.py", "exec"), stop.__dict__)
exec(compile(files["watchdog.py"], "watchdog.py", "exec"), {{"__name__": "__main__", "__package__": package.__name__}})
"""
PROGRAM = LOADER.format(files={"self_stop.py": (_AGENT / "self_stop.py").read_text(),
                               "watchdog.py": (_AGENT / "serving_watchdog.py").read_text()})
BUNDLE = base64.b64encode(zlib.compress(PROGRAM.encode(), 9)).decode()
# What the start script runs: $FLEET_WATCHDOG joins the parts and runs the program they hold.
BOOT = ("import base64,os,zlib;e=os.environ;exec(zlib.decompress(base64.b64decode("
        f'"".join(e["{ENV}_%d"%i] for i in range(int(e["{ENV}_PARTS"]))))))')


def issue(instance: Instance) -> str:
    """The box's token: it opens only this box's check-in and lasts the dead-man window (each answer brings a fresh
    one)."""
    return PREFIX + _SIGNER.sign(f"{instance.pk}.{instance.label}")


def instance_for(token: str, pk: int) -> Instance | None:
    """The box `pk` when `token` is its own and unexpired, else None (another box's token opens nothing here)."""
    if not token.startswith(PREFIX):
        return None
    try:
        value = _SIGNER.unsign(token[len(PREFIX):], max_age=settings.AGENT_DEAD_MAN_WINDOW_S)
    except signing.BadSignature:  # forged, or expired (SignatureExpired is one)
        return None
    found_pk, _, label = value.partition(".")
    if found_pk != str(pk):
        return None
    return Instance.objects.filter(pk=pk, label=label, purpose="serving").first()


def checkin_url(instance: Instance) -> str:
    return f"{settings.DASHBOARD_URL.rstrip('/')}/api/serving/v1/instances/{instance.pk}/checkin"


def env_parts(name: str, text: str) -> dict[str, str]:
    """`text` in variables of at most ENV_PART characters, NAME_0, NAME_1, ..., and NAME_PARTS, their number: what
    a box joins again. A box's variables are short, and a grant or a program is not."""
    parts = [text[i:i + ENV_PART] for i in range(0, len(text), ENV_PART)]
    return {f"{name}_PARTS": str(len(parts)), **{f"{name}_{i}": part for i, part in enumerate(parts)}}


def box_env(instance: Instance) -> dict[str, str]:
    """Where and as whom the box checks in, how often, the window, and the watchdog's files (in parts)."""
    return {"FLEET_CHECKIN_URL": checkin_url(instance), "FLEET_CHECKIN_TOKEN": issue(instance),
            "FLEET_CHECKIN_S": str(max(1, settings.AGENT_HEARTBEAT_TIMEOUT_S // 4)),
            "FLEET_DEAD_MAN_S": str(settings.AGENT_DEAD_MAN_WINDOW_S), ENV: BOOT, **env_parts(ENV, BUNDLE)}


# The start script's line that starts the watchdog in the background, in the box's work folder ($root), before
# anything else: a box whose adapter fetch or vLLM hangs is covered too.
START = f'nohup python3 -c "${ENV}" >> "$root/watchdog.log" 2>&1 &'

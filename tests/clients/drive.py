"""Runs calls of an official SDK in the clients' own virtual environment and prints what came back, as JSON.

`python drive.py vast|runpod < calls.json`, where calls.json is `{"connect": {...}, "calls": [[name, kwargs], ...]}`.
Each call's answer is `{"value": ...}` or, when it raised, `{"error": <exception class>, "message": ...}`; one
failing call does not stop the ones after it. Only the SDK's public functions are called, as a user's script would.
"""

import json
import os
import sys


def vast(connect: dict):
    from vastai import VastAI

    sdk = VastAI(api_key=connect["api_key"], server_url=connect["url"], retry=1)
    return lambda name, kwargs: getattr(sdk, name)(**kwargs)


def runpod(connect: dict):
    os.environ["RUNPOD_API_BASE_URL"] = connect["url"]
    import runpod as sdk

    sdk.api_key = connect["api_key"]
    return lambda name, kwargs: getattr(sdk, name)(**kwargs)


def main() -> None:
    request = json.load(sys.stdin)
    call = {"vast": vast, "runpod": runpod}[sys.argv[1]](request["connect"])
    answers = []
    for name, kwargs in request["calls"]:
        try:
            answers.append({"value": call(name, kwargs)})
        except Exception as exc:  # noqa: BLE001 - the test asserts on which error the SDK raised
            answers.append({"error": type(exc).__name__, "message": str(exc)})
    json.dump(answers, sys.stdout, default=str)


if __name__ == "__main__":
    main()
